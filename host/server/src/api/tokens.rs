//! Token routes (issue, list, revoke) and the audit log of admin actions; admins only (see
//! `guard`).

use super::AppState;
use super::extract::{Decoded, SMALL_BODY_BYTES, decode_query};
use super::guard::Caller;
use super::problem::ApiError;
use super::tasks::page_limit;
use crate::auth::Issued;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State as Shared};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluice_model::{AuditEvent, Role, TokenRecord};
use sluice_wire::TokenRequest;

const MAX_AUDIT_LIMIT: usize = 1000;

/// A token as listed: its record without the hash.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenView {
    id: String,
    role: Role,
    #[serde(skip_serializing_if = "Option::is_none")]
    device: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<String>,
    created_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    revoked_at_ms: Option<u64>,
    issued_by: String,
}

impl From<TokenRecord> for TokenView {
    fn from(record: TokenRecord) -> Self {
        TokenView {
            id: record.id,
            role: record.role,
            device: record.device,
            tenant: record.tenant,
            worker: record.worker,
            created_at_ms: record.created_at_ms,
            expires_at_ms: record.expires_at_ms,
            revoked_at_ms: record.revoked_at_ms,
            issued_by: record.issued_by,
        }
    }
}

/// The answer to an issue: the token's text, shown this once, and its record.
#[derive(Serialize, utoipa::ToSchema)]
pub struct IssuedView {
    token: String,
    #[serde(flatten)]
    record: TokenView,
}

/// Token work syncs the store: off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::Internal(format!("token work stopped: {e}")))?
}

/// Issues a token; its text is in this answer only. On a server with auth off the first one
/// must be an admin's, and issuing it turns auth on.
#[utoipa::path(post, path = "/v1/tokens", tag = "access",
    request_body = TokenRequest,
    responses((status = 201, description = "The token, shown this once", body = IssuedView)))]
pub async fn issue(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<TokenRequest>(&headers, body, SMALL_BODY_BYTES)
        .await?;
    let gate = state.gate.clone();
    let Issued { token, record } = blocking(move || Ok(gate.issue(request, &caller)?)).await?;
    tracing::info!(token_id = %record.id, role = %record.role, "token issued");
    let view = IssuedView {
        token,
        record: record.into(),
    };
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenList {
    tokens: Vec<TokenView>,
}

/// Every token's record (never the token), revoked ones included.
#[utoipa::path(get, path = "/v1/tokens", tag = "access",
    responses((status = 200, description = "The tokens", body = TokenList)))]
pub async fn list(Shared(state): Shared<AppState>) -> Result<Json<TokenList>, ApiError> {
    let tokens = state.gate.list()?;
    Ok(Json(TokenList {
        tokens: tokens.into_iter().map(TokenView::from).collect(),
    }))
}

/// Revokes a token; it is refused from the next request on.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "access",
    params(("id" = String, Path, description = "The token's id")),
    responses((status = 200, description = "The revoked token", body = TokenView)))]
pub async fn revoke(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    let gate = state.gate.clone();
    let record = blocking(move || Ok(gate.revoke(&id, &caller)?)).await?;
    tracing::info!(token_id = %record.id, "token revoked");
    Ok(Json(record.into()))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    after: Option<u64>,
    limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AuditPage {
    events: Vec<AuditEvent>,
}

/// The audit log of admin actions after `after`, oldest first.
#[utoipa::path(get, path = "/v1/audit", tag = "access",
    params(AuditParams),
    responses((status = 200, description = "A page of the audit log", body = AuditPage)))]
pub async fn audit(
    Shared(state): Shared<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<AuditPage>, ApiError> {
    let params: AuditParams = decode_query(query.as_deref())?;
    let limit = page_limit(params.limit, MAX_AUDIT_LIMIT, MAX_AUDIT_LIMIT)?;
    let events = state.gate.audit_after(params.after.unwrap_or(0), limit)?;
    Ok(Json(AuditPage { events }))
}

/// Logs an admin action that already took effect. A failure to log it is reported (the
/// action is not undone: it is durable already), so the caller learns the log is short.
pub(super) async fn record(
    state: &AppState,
    caller: &crate::auth::Principal,
    action: &str,
    target: String,
    detail: Option<String>,
) -> Result<(), ApiError> {
    let gate = state.gate.clone();
    let event = caller.audit(action, target, detail);
    blocking(move || Ok(gate.audit(event)?)).await?;
    Ok(())
}
