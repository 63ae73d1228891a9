//! Vector collection routes: the collections known (declared, or announced by shard workers)
//! with the shards that have a live worker, and declaring or forgetting one.

use super::AppState;
use super::extract::{ApiPath, Decoded};
use super::guard::Caller;
use super::problem::ApiError;
use crate::collections::CollectionError;
use axum::Json;
use axum::body::Body;
use axum::extract::State as Shared;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use sluice_engine::CollectionView;
use sluice_model::{Collection, Metric, check_collection_name};

const MAX_COLLECTION_BODY_BYTES: usize = 1024;

#[derive(Serialize, utoipa::ToSchema)]
pub struct CollectionsResponse {
    collections: Vec<CollectionView>,
}

/// A collection's declaration.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CollectionRequest {
    /// Numbers in each vector, 1 to 4,096.
    dim: u32,
    /// `l2` (squared Euclidean, the default) or `ip` (inner product, negated).
    #[serde(default)]
    metric: Metric,
    /// Stored shards, 1 to 1,024.
    shards: u32,
}

fn checked_name(name: &str) -> Result<(), ApiError> {
    check_collection_name(name).map_err(|e| ApiError::InvalidRequest(e.to_string()))
}

/// Every collection known, declared or announced by its shard workers, with the shards that
/// have a live worker.
#[utoipa::path(get, path = "/v1/collections", tag = "vectors",
    responses((status = 200, description = "The collections", body = CollectionsResponse)))]
pub async fn list(Shared(state): Shared<AppState>) -> Result<Json<CollectionsResponse>, ApiError> {
    Ok(Json(CollectionsResponse {
        collections: state.scheduler.collections().await?,
    }))
}

/// One collection and its shards.
#[utoipa::path(get, path = "/v1/collections/{name}", tag = "vectors",
    params(("name" = String, Path, description = "The collection's name")),
    responses((status = 200, description = "The collection", body = CollectionView)))]
pub async fn detail(
    Shared(state): Shared<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<CollectionView>, ApiError> {
    checked_name(&name)?;
    state
        .scheduler
        .collections()
        .await?
        .into_iter()
        .find(|c| c.name == name)
        .map(Json)
        .ok_or(ApiError::CollectionNotFound(name))
}

/// Declares a collection's dimension, metric and shard count: from now on a shard worker that
/// disagrees is refused, and a query naming another metric or dimension is refused.
#[utoipa::path(put, path = "/v1/collections/{name}", tag = "vectors",
    params(("name" = String, Path, description = "The collection's name")),
    request_body = CollectionRequest,
    responses((status = 200, description = "The collection declared", body = Collection)))]
pub async fn declare(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Collection>, ApiError> {
    checked_name(&name)?;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<CollectionRequest>(&headers, body, MAX_COLLECTION_BODY_BYTES)
        .await?;
    let collection = Collection {
        name: name.clone(),
        dim: request.dim,
        metric: request.metric,
        shards: request.shards,
    };
    collection
        .validate()
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let table = state.collections.clone();
    let declared = collection.clone();
    let all = tokio::task::spawn_blocking(move || table.put(declared))
        .await
        .map_err(|e| ApiError::Internal(format!("the collection's write stopped: {e}")))??;
    state.scheduler.set_collections(all).await?;
    let detail = format!(
        "dim {}, metric {}, {} shards",
        collection.dim,
        collection.metric.as_str(),
        collection.shards
    );
    super::tokens::record(
        &state,
        &caller,
        "collection.declare",
        format!("collection {name}"),
        Some(detail),
    )
    .await?;
    Ok(Json(collection))
}

/// Forgets a collection's declaration; its shard workers' announcements still make it known.
#[utoipa::path(delete, path = "/v1/collections/{name}", tag = "vectors",
    params(("name" = String, Path, description = "The collection's name")),
    responses((status = 204, description = "Forgotten")))]
pub async fn remove(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<axum::http::StatusCode, ApiError> {
    checked_name(&name)?;
    let table = state.collections.clone();
    let removed = name.clone();
    let all = tokio::task::spawn_blocking(move || table.remove(&removed))
        .await
        .map_err(|e| ApiError::Internal(format!("the collection's write stopped: {e}")))??
        .ok_or_else(|| ApiError::CollectionNotFound(name.clone()))?;
    state.scheduler.set_collections(all).await?;
    super::tokens::record(
        &state,
        &caller,
        "collection.remove",
        format!("collection {name}"),
        None,
    )
    .await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

impl From<CollectionError> for ApiError {
    fn from(error: CollectionError) -> Self {
        match error {
            CollectionError::Store(store) => (&store).into(),
            too_many @ CollectionError::TooMany => ApiError::InvalidRequest(too_many.to_string()),
        }
    }
}
