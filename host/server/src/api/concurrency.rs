//! Concurrency-limit routes: the limits in force with the tasks each key holds, and setting or
//! removing a key's limit (kept in the catalog, audited, in force for the next claim).

use super::AppState;
use super::extract::{ApiPath, Decoded};
use super::guard::Caller;
use super::problem::ApiError;
use crate::concurrency_limits::{LimitError, LimitInForce, LimitTable};
use axum::Json;
use axum::body::Body;
use axum::extract::State as Shared;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use sluice_model::{ConcurrencyLimit, MAX_CONCURRENCY_LIMIT, check_concurrency_limit};
use std::collections::BTreeMap;

const MAX_LIMIT_BODY_BYTES: usize = 1024;

#[derive(Serialize, utoipa::ToSchema)]
pub struct LimitsResponse {
    /// Every limit in force, by key (a key ending in `*` is a prefix), and whether the
    /// configuration or the API set it; the API's win.
    limits: Vec<LimitInForce>,
    /// Leased tasks per concurrency key, for the keys that hold any.
    running: BTreeMap<String, u32>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitRequest {
    /// Tasks of the key leased at once, at most (0 holds them all until it is raised).
    #[schema(maximum = 1_000_000)]
    limit: u32,
}

/// The concurrency limits in force, and how many tasks each key holds now.
#[utoipa::path(get, path = "/v1/concurrency-limits", tag = "dispatch",
    responses((status = 200, description = "The limits", body = LimitsResponse)))]
pub async fn list(Shared(state): Shared<AppState>) -> Json<LimitsResponse> {
    Json(LimitsResponse {
        limits: state.concurrency.view().as_ref().clone(),
        running: state.scheduler.snapshot().keys_running.clone(),
    })
}

fn checked_key(key: &str) -> Result<(), ApiError> {
    check_concurrency_limit(key, 0).map_err(|e| {
        ApiError::InvalidRequest(format!(
            "a limit's key is a concurrency key, or a prefix ending in `*`: {e}"
        ))
    })
}

/// Writes a change of `key`'s limit to the catalog (`write` answers none when the key has no
/// limit to change), puts the limits now in force to the engine, and audits it as `action`.
async fn change(
    state: &AppState,
    caller: &crate::auth::Principal,
    key: &str,
    action: &str,
    detail: Option<String>,
    write: impl FnOnce(&LimitTable, &str) -> Result<Option<Vec<ConcurrencyLimit>>, LimitError>
    + Send
    + 'static,
) -> Result<(), ApiError> {
    let table = state.concurrency.clone();
    let changed_key = key.to_owned();
    let in_force = tokio::task::spawn_blocking(move || write(&table, &changed_key))
        .await
        .map_err(|e| ApiError::Internal(format!("the limit's write stopped: {e}")))??
        .ok_or_else(|| ApiError::ConcurrencyLimitNotFound(key.to_owned()))?;
    state.scheduler.set_concurrency_limits(in_force).await?;
    super::tokens::record(
        state,
        caller,
        action,
        format!("concurrency limit {key}"),
        detail,
    )
    .await
}

/// Sets the limit on a concurrency key (or a prefix of keys ending in `*`), over the
/// configuration's; in force from the next claim.
#[utoipa::path(put, path = "/v1/concurrency-limits/{key}", tag = "dispatch",
    params(("key" = String, Path, description = "A concurrency key, or a prefix ending in `*`")),
    request_body = LimitRequest,
    responses((status = 200, description = "The limit in force", body = ConcurrencyLimit)))]
pub async fn set(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(key): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ConcurrencyLimit>, ApiError> {
    checked_key(&key)?;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<LimitRequest>(&headers, body, MAX_LIMIT_BODY_BYTES)
        .await?;
    if request.limit > MAX_CONCURRENCY_LIMIT {
        return Err(ApiError::InvalidRequest(format!(
            "limit must be 0 to {MAX_CONCURRENCY_LIMIT}"
        )));
    }
    let limit = request.limit;
    let detail = Some(format!("limit {limit}"));
    change(
        &state,
        &caller,
        &key,
        "concurrency.set",
        detail,
        move |table, key| table.set(key, limit).map(Some),
    )
    .await?;
    Ok(Json(ConcurrencyLimit {
        key,
        limit: request.limit,
    }))
}

/// Removes the limit the API set on a key; the configuration's, if any, is in force again.
#[utoipa::path(delete, path = "/v1/concurrency-limits/{key}", tag = "dispatch",
    params(("key" = String, Path, description = "A concurrency key, or a prefix ending in `*`")),
    responses((status = 200, description = "The limits in force now", body = LimitsResponse)))]
pub async fn remove(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(key): ApiPath<String>,
) -> Result<Json<LimitsResponse>, ApiError> {
    checked_key(&key)?;
    change(
        &state,
        &caller,
        &key,
        "concurrency.remove",
        None,
        |table, key| table.remove(key),
    )
    .await?;
    Ok(list(Shared(state)).await)
}
