//! Policy routes: upload a component as a new version, activate a version, roll back, and
//! read each kind's active version, history and counters.

use super::AppState;
use super::extract::{ApiPath, Decoded, KindPath, decode_query, media_type, read_json};
use super::guard::Caller;
use super::problem::ApiError;
use crate::auth::signing::SIGNATURE_HEADER;
use crate::scheduler::{Clock, SystemClock};
use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State as Shared};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_model::PolicyKind;
use sluice_policy_runtime::{KindStatus, MAX_CONFIG_BYTES, PolicyRegistry};
use sluice_policy_runtime::{UploadOptions, Uploaded};
use std::sync::Arc;

/// Media types an upload may declare: a component is WebAssembly bytes.
const COMPONENT_MEDIA_TYPES: [&str; 2] = ["application/wasm", "application/octet-stream"];

/// Runs registry work (compiling, instantiating, syncing) off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    registry: &Arc<PolicyRegistry>,
    work: impl FnOnce(&PolicyRegistry, u64) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let registry = registry.clone();
    tokio::task::spawn_blocking(move || work(&registry, SystemClock.now_ms()))
        .await
        .map_err(|e| ApiError::Internal(format!("policy work stopped: {e}")))?
}

/// The `Sluice-Signature` header's text, if sent.
fn signature_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match headers.get(SIGNATURE_HEADER) {
        Some(value) => Ok(Some(value.to_str().map_err(|_| {
            ApiError::from(crate::auth::signing::SignatureError::Malformed(
                "the header must be visible ASCII".into(),
            ))
        })?)),
        None => Ok(None),
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct UploadQuery {
    /// `name=value` lines for the component's `init`; without it, the server's config.
    config: Option<String>,
    /// Memory this version's instances may use, in bytes (1 MiB to
    /// `policy_max_memory_limit_bytes`); without it, `policy_memory_limit_bytes`.
    memory_limit_bytes: Option<u64>,
    /// Fuel per call of this version's instances (1000 to `policy_max_call_fuel`); without
    /// it, `policy_call_fuel`.
    call_fuel: Option<u64>,
}

/// Stores a component (`application/wasm`) as the next version of a kind, once it compiles,
/// imports nothing it may not, inits and passes the kind's conformance cases; not activated.
/// With `policy_signing_keys` set it must carry `Sluice-Signature: keyid=ID,sig=BASE64`.
#[utoipa::path(put, path = "/v1/policies/{kind}", tag = "policies",
    params(
        ("kind" = PolicyKind, Path, description = "priority, aging, retry, split or merge"),
        ("Sluice-Signature" = Option<String>, Header, description = "keyid=ID,sig=BASE64: an ed25519 signature of the body"),
        UploadQuery,
    ),
    request_body(description = "The component's bytes (`application/wasm` is taken too)",
        content((Vec<u8> = "application/octet-stream"))),
    responses(
        (status = 201, description = "A new version", body = Uploaded),
        (status = 200, description = "The same bytes and config as an existing version", body = Uploaded),
    ))]
pub async fn upload(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(kind): ApiPath<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    state.refuse_if_draining()?;
    // The body is read before anything else is judged: refusing while the client is still
    // sending would reach it as a broken connection rather than as the answer.
    let Decoded {
        value: bytes,
        _budget,
    } = state
        .read_bytes(&headers, body, state.limits.policy_body_bytes)
        .await?;
    let kind: PolicyKind = kind.parse()?;
    let query: UploadQuery = decode_query(query.as_deref())?;
    if query
        .config
        .as_ref()
        .is_some_and(|c| c.len() > MAX_CONFIG_BYTES)
    {
        return Err(ApiError::InvalidQuery(format!(
            "config is over {MAX_CONFIG_BYTES} bytes"
        )));
    }
    let is_component =
        media_type(&headers).is_some_and(|media| COMPONENT_MEDIA_TYPES.contains(&media.as_str()));
    if !is_component {
        return Err(ApiError::UnsupportedMediaType("application/wasm"));
    }
    let signature = signature_header(&headers)?;
    // Checked before anything is compiled or stored: an unsigned module is never kept.
    let signed_by = state.signing_keys.verify(&bytes, signature)?;
    let uploaded = blocking(&state.policies, move |registry, now_ms| {
        let options = UploadOptions {
            config: query.config,
            signed_by,
            memory_limit_bytes: query.memory_limit_bytes,
            call_fuel: query.call_fuel,
        };
        Ok(registry.upload_with(kind, &bytes, options, now_ms)?)
    })
    .await?;
    if uploaded.created {
        let version = &uploaded.version;
        let detail = version
            .signed_by
            .as_ref()
            .map(|key| format!("sha256={} signed_by={key}", version.sha256))
            .or_else(|| Some(format!("sha256={}", version.sha256)));
        super::tokens::record(
            &state,
            &caller,
            "policy.upload",
            format!("{kind} v{}", version.version),
            detail,
        )
        .await?;
    }
    let status = if uploaded.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let location = format!("/v1/policies/{kind}");
    let mut response = (status, Json(uploaded)).into_response();
    if let Ok(location) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

/// Stores a data blob beside a version before it is activated (split-ivf's `centroids`, say):
/// the version must init and pass its conformance cases with it; the component reads it with
/// `sluice:policy/data.get` in `init`. Refused (409) once the version has been activated.
/// With `policy_signing_keys` set, the blob must be signed like a component.
#[utoipa::path(put, path = "/v1/policies/{kind}/{version}/data/{name}", tag = "policies",
    params(
        ("Sluice-Signature" = Option<String>, Header, description = "keyid=ID,sig=BASE64: an ed25519 signature of the body"),
        ("kind" = PolicyKind, Path, description = "priority, aging, retry, split or merge"),
        ("version" = u32, Path, description = "A stored version, not yet activated"),
        ("name" = String, Path, description = "1 to 64 ASCII letters, digits, `.`, `_` or `-`"),
    ),
    request_body(description = "The blob's bytes", content((Vec<u8> = "application/octet-stream"))),
    responses((status = 201, description = "Stored", body = sluice_model::DataRef)))]
pub async fn put_data(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath((kind, version, name)): ApiPath<(String, u32, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    state.refuse_if_draining()?;
    let Decoded {
        value: bytes,
        _budget,
    } = state
        .read_bytes(&headers, body, state.limits.policy_data_bytes)
        .await?;
    let kind: PolicyKind = kind.parse()?;
    // With signing keys set, data changes what a version decides as much as its code does:
    // it must be signed the same way.
    let signature = signature_header(&headers)?;
    state.signing_keys.verify(&bytes, signature)?;
    let stored = {
        let name = name.clone();
        blocking(&state.policies, move |registry, _| {
            Ok(registry.put_data(kind, version, &name, &bytes)?)
        })
        .await?
    };
    super::tokens::record(
        &state,
        &caller,
        "policy.data",
        format!("{kind} v{version} {name}"),
        Some(format!(
            "sha256={} size_bytes={}",
            stored.sha256, stored.size_bytes
        )),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(stored)).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ActivateRequest {
    version: u32,
}

/// Makes a version the active one (0: the built-in one).
#[utoipa::path(post, path = "/v1/policies/{kind}/activate", tag = "policies",
    params(("kind" = PolicyKind, Path, description = "priority, aging, retry, split or merge")),
    request_body = ActivateRequest,
    responses((status = 200, description = "The kind now", body = KindStatus)))]
pub async fn activate(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    KindPath(kind): KindPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<KindStatus>, ApiError> {
    state.refuse_if_draining()?;
    let limits = &state.limits;
    let request: Decoded<ActivateRequest> = read_json(
        &headers,
        body,
        4096,
        limits.body_timeout,
        &state.body_budget,
    )
    .await?;
    let version = request.value.version;
    let status = blocking(&state.policies, move |registry, now_ms| {
        Ok(registry.activate(kind, version, now_ms)?)
    })
    .await?;
    state.scheduler.policies_changed();
    super::tokens::record(
        &state,
        &caller,
        "policy.activate",
        format!("{kind} v{version}"),
        None,
    )
    .await?;
    Ok(Json(status))
}

/// Restores the version active before the current one.
#[utoipa::path(post, path = "/v1/policies/{kind}/rollback", tag = "policies",
    params(("kind" = PolicyKind, Path, description = "priority, aging, retry, split or merge")),
    responses((status = 200, description = "The kind now", body = KindStatus)))]
pub async fn rollback(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    KindPath(kind): KindPath,
) -> Result<Json<KindStatus>, ApiError> {
    state.refuse_if_draining()?;
    let status = blocking(&state.policies, move |registry, now_ms| {
        Ok(registry.rollback(kind, now_ms)?)
    })
    .await?;
    state.scheduler.policies_changed();
    super::tokens::record(
        &state,
        &caller,
        "policy.rollback",
        format!("{kind} to v{}", status.active_version),
        None,
    )
    .await?;
    Ok(Json(status))
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct PolicyList {
    policies: Vec<KindStatus>,
}

/// Every kind with its active version and counters.
#[utoipa::path(get, path = "/v1/policies", tag = "policies",
    responses((status = 200, description = "The kinds", body = PolicyList)))]
pub async fn list(Shared(state): Shared<AppState>) -> Response {
    Json(serde_json::json!({ "policies": state.policies.list() })).into_response()
}

/// A kind in full: its versions, activations and log.
#[utoipa::path(get, path = "/v1/policies/{kind}", tag = "policies",
    params(("kind" = PolicyKind, Path, description = "priority, aging, retry, split or merge")),
    responses((status = 200, description = "The kind", body = sluice_policy_runtime::KindDetail)))]
pub async fn detail(
    Shared(state): Shared<AppState>,
    KindPath(kind): KindPath,
) -> Result<Response, ApiError> {
    let detail = blocking(&state.policies, move |registry, _| {
        Ok(registry.detail(kind)?)
    })
    .await?;
    Ok(Json(detail).into_response())
}
