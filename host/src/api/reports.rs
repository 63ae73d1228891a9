//! Workers' reports on their attempts: start, lease heartbeat, complete, fail. Each carries
//! the lease token the claim gave; a stale token is refused with 409 and logged.

use super::AppState;
use super::extract::{SMALL_BODY_BYTES, TaskIdPath, read_json};
use super::problem::ApiError;
use crate::engine::Report;
use crate::model::{FailureClass, Task};
use axum::Json;
use axum::body::Body;
use axum::extract::State as Shared;
use axum::http::HeaderMap;
use serde::Deserialize;

/// A failure message is cut to this many bytes.
const MAX_MESSAGE_BYTES: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenOnly {
    lease_token: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    lease_token: String,
    #[serde(default)]
    result: serde_json::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    lease_token: String,
    class: FailureClass,
    #[serde(default)]
    message: String,
}

async fn body<T: serde::de::DeserializeOwned>(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
    limit_bytes: usize,
) -> Result<T, ApiError> {
    Ok(read_json(
        headers,
        body,
        limit_bytes,
        state.limits.body_timeout,
        &state.body_budget,
    )
    .await?
    .value)
}

pub async fn start(
    Shared(state): Shared<AppState>,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<Task>, ApiError> {
    let request: TokenOnly = body(&state, &headers, raw, SMALL_BODY_BYTES).await?;
    let task = state
        .scheduler
        .report(id, request.lease_token, Report::Start)
        .await?;
    Ok(Json(task))
}

pub async fn heartbeat(
    Shared(state): Shared<AppState>,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<Task>, ApiError> {
    let request: TokenOnly = body(&state, &headers, raw, SMALL_BODY_BYTES).await?;
    let task = state
        .scheduler
        .report(id, request.lease_token, Report::Heartbeat)
        .await?;
    Ok(Json(task))
}

pub async fn complete(
    Shared(state): Shared<AppState>,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<Task>, ApiError> {
    let limit = state.limits.body_bytes;
    let request: CompleteRequest = body(&state, &headers, raw, limit).await?;
    let task = state
        .scheduler
        .report(
            id,
            request.lease_token,
            Report::Complete {
                result: request.result,
            },
        )
        .await?;
    Ok(Json(task))
}

pub async fn fail(
    Shared(state): Shared<AppState>,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<Task>, ApiError> {
    let request: FailRequest = body(&state, &headers, raw, SMALL_BODY_BYTES).await?;
    if request.class == FailureClass::LeaseExpired {
        return Err(ApiError::InvalidRequest(
            "class lease-expired is the scheduler's to give; use transient, node-busy, timeout, permanent or invalid-input".into(),
        ));
    }
    let mut message = request.message;
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    let task = state
        .scheduler
        .report(
            id,
            request.lease_token,
            Report::Fail {
                class: request.class,
                message,
            },
        )
        .await?;
    Ok(Json(task))
}
