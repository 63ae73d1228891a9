//! Reading requests: bounded, timed JSON bodies, query strings and task ids, each failing with
//! an `ApiError` rather than a framework rejection, so every 4xx is problem+json.

use super::problem::ApiError;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path};
use axum::http::{HeaderMap, header, request::Parts};
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use sluice_model::TaskId;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A decoded body, and its share of the server's budget for request bytes in memory: hold it
/// until the request is answered.
pub struct Decoded<T> {
    pub value: T,
    pub _budget: OwnedSemaphorePermit,
}

/// Reads at most `limit_bytes` of JSON within `timeout`, and decodes it as `T`. The body's
/// size (its Content-Length, or else the limit) is first taken from `budget`; when the budget
/// is spent the request is refused as overloaded rather than queued without bound.
pub async fn read_json<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    limit_bytes: usize,
    timeout: Duration,
    budget: &Arc<Semaphore>,
) -> Result<Decoded<T>, ApiError> {
    let is_json = media_type(headers)
        .map(|v| v == "application/json" || v.ends_with("+json"))
        .unwrap_or(false);
    if !is_json {
        return Err(ApiError::UnsupportedMediaType("application/json"));
    }
    let bytes = read_body(headers, body, limit_bytes, timeout, budget).await?;
    Ok(Decoded {
        value: decode_json(&bytes.value)?,
        _budget: bytes._budget,
    })
}

/// The request's media type, lower-cased, without parameters.
pub fn media_type(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
}

/// Reads at most `limit_bytes` within `timeout`, with its share of `budget` (see `read_json`).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit_bytes: usize,
    timeout: Duration,
    budget: &Arc<Semaphore>,
) -> Result<Decoded<Bytes>, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // An oversized body is still read up to the limit before it is refused: answering while
    // the client is mid-upload would reach it as a broken pipe instead of a 413.
    let share = declared.unwrap_or(limit_bytes).clamp(1, limit_bytes);
    let permit = u32::try_from(share)
        .ok()
        .and_then(|share| budget.clone().try_acquire_many_owned(share).ok())
        .ok_or(ApiError::Overloaded)?;
    let bytes = tokio::time::timeout(timeout, read_bounded(body, limit_bytes))
        .await
        .map_err(|_| ApiError::BodyTimeout(timeout.as_secs()))??;
    Ok(Decoded {
        value: bytes,
        _budget: permit,
    })
}

/// Bytes read and thrown away after a body passes its limit, so that a client still sending
/// gets the 413 rather than a broken pipe (a 50 MiB upload against a 16 MiB limit, say). It
/// costs no memory, and the body timeout bounds its time. Past this the connection is simply
/// closed.
const MAX_DISCARD_BYTES: usize = 64 << 20;

/// Reads a body of at most `limit_bytes`. An oversized body is read on (and discarded) up to
/// `MAX_DISCARD_BYTES`, then refused.
async fn read_bounded(mut body: Body, limit_bytes: usize) -> Result<Bytes, ApiError> {
    let mut kept = BytesMut::new();
    let mut discarded = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::UnreadableBody(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if discarded == 0 && kept.len() + data.len() <= limit_bytes {
            kept.extend_from_slice(&data);
            continue;
        }
        discarded += data.len();
        if discarded > MAX_DISCARD_BYTES {
            break;
        }
    }
    if discarded > 0 {
        return Err(ApiError::BodyTooLarge { limit: limit_bytes });
    }
    Ok(kept.freeze())
}

/// Decodes JSON, telling broken syntax (400 malformed-json) from a well-formed body of the
/// wrong shape (400 invalid-request: wrong type, unknown field, bad enum value).
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|error| match error.classify() {
        serde_json::error::Category::Data => ApiError::InvalidRequest(error.to_string()),
        _ => ApiError::MalformedJson(error.to_string()),
    })
}

/// Decodes a query string; unknown parameters are refused by the target type.
pub fn decode_query<T: DeserializeOwned>(query: Option<&str>) -> Result<T, ApiError> {
    serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|error| ApiError::InvalidQuery(error.to_string()))
}

/// Path parameters of any shape, as axum's `Path` reads them, but a bad one (a version that is
/// not a number, say) is refused as problem+json like every other bad input, not axum's plain
/// text.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(value) = Path::<T>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::InvalidRequest(rejection.body_text()))?;
        Ok(ApiPath(value))
    }
}

/// The `{kind}` of a policy route.
pub struct KindPath(pub sluice_model::PolicyKind);

impl<S: Send + Sync> FromRequestParts<S> for KindPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(text) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::InvalidRequest(rejection.body_text()))?;
        Ok(KindPath(text.parse()?))
    }
}

/// The `{id}` of a task route.
pub struct TaskIdPath(pub TaskId);

impl<S: Send + Sync> FromRequestParts<S> for TaskIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(text) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::InvalidRequest(rejection.body_text()))?;
        Ok(TaskIdPath(text.parse()?))
    }
}

/// The `{id}` of a worker route, checked like a task's names.
pub struct WorkerIdPath(pub String);

impl<S: Send + Sync> FromRequestParts<S> for WorkerIdPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(text) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::InvalidRequest(rejection.body_text()))?;
        sluice_model::check_worker_id(&text)
            .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        Ok(WorkerIdPath(text))
    }
}

/// A small JSON body (a heartbeat, a claim, a report without a result): 64 KiB at most.
pub const SMALL_BODY_BYTES: usize = 64 * 1024;
