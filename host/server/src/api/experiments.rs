//! Experiment routes: start a live A/B or shadow experiment of policy versions, list them,
//! read one's report, stop it, or promote a variant to active.

use super::AppState;
use super::extract::{ApiPath, Decoded};
use super::guard::Caller;
use super::policies::blocking;
use super::problem::ApiError;
use crate::experiment::ExperimentReport;
use axum::Json;
use axum::body::Body;
use axum::extract::State as Shared;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_model::{Experiment, ExperimentSpec};

/// The largest experiment body: eight variants with their names fit in far less.
const MAX_EXPERIMENT_BODY_BYTES: usize = 16 * 1024;

fn experiment_id(text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>()
        .ok()
        .filter(|&id| id > 0)
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "an experiment id is a whole number from 1; got `{}`",
                text.chars().take(32).collect::<String>()
            ))
        })
}

/// Starts an experiment of a kind's versions (one per kind at a time). Live: each new task
/// is assigned a variant by a stable hash of its `assign_by` key, and that variant's version
/// decides for it. Shadow: the active version decides, the variants beside it, unheeded.
#[utoipa::path(post, path = "/v1/experiments", tag = "experiments",
    request_body = ExperimentSpec,
    responses((status = 201, description = "Started", body = Experiment)))]
pub async fn start(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    state.refuse_if_draining()?;
    // The body's share of the budget is held until the answer, as for every body.
    let Decoded {
        value: spec,
        _budget,
    } = state
        .read_json::<ExperimentSpec>(&headers, body, MAX_EXPERIMENT_BODY_BYTES)
        .await?;
    let experiment = blocking(&state.policies, move |registry, now_ms| {
        Ok(registry.start_experiment(spec, now_ms)?)
    })
    .await?;
    super::tokens::record(
        &state,
        &caller,
        "experiment.start",
        format!("experiment {}", experiment.id),
        Some(experiment.describe()),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(experiment)).into_response())
}

/// Every experiment, running and ended, oldest first.
#[utoipa::path(get, path = "/v1/experiments", tag = "experiments",
    responses((status = 200, description = "The experiments", body = Vec<Experiment>)))]
pub async fn list(Shared(state): Shared<AppState>) -> Result<Json<Vec<Experiment>>, ApiError> {
    let all = blocking(&state.policies, |registry, _| Ok(registry.experiments()?)).await?;
    Ok(Json(all))
}

/// An experiment's report: per variant, its tasks' waits per bucket, ends, retries and
/// attempts (from the task records), what its version did, and each variant against the first
/// with 95 % bootstrap intervals and a verdict.
#[utoipa::path(get, path = "/v1/experiments/{id}", tag = "experiments",
    params(("id" = u32, Path, description = "The experiment's id")),
    responses((status = 200, description = "The report", body = ExperimentReport)))]
pub async fn report(
    Shared(state): Shared<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ExperimentReport>, ApiError> {
    let id = experiment_id(&id)?;
    let scheduler = state.scheduler.clone();
    let report = blocking(&state.policies, move |registry, _| {
        let experiment = registry.experiment(id)?;
        let runtime = registry.variant_figures(&experiment);
        Ok(crate::experiment::report(&experiment, runtime, |query| {
            scheduler.list(query)
        })?)
    })
    .await?;
    Ok(Json(report))
}

/// Ends a running experiment; the active version stays as it is. Tasks keep their variant
/// tags, but from now on the active version decides for them.
#[utoipa::path(post, path = "/v1/experiments/{id}/stop", tag = "experiments",
    params(("id" = u32, Path, description = "The experiment's id")),
    responses((status = 200, description = "Ended", body = Experiment)))]
pub async fn stop(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Experiment>, ApiError> {
    state.refuse_if_draining()?;
    let id = experiment_id(&id)?;
    let experiment = blocking(&state.policies, move |registry, now_ms| {
        Ok(registry.stop_experiment(id, now_ms)?)
    })
    .await?;
    super::tokens::record(
        &state,
        &caller,
        "experiment.stop",
        format!("experiment {id}"),
        None,
    )
    .await?;
    Ok(Json(experiment))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteRequest {
    /// The variant's name.
    variant: String,
}

/// Makes a variant's version the active one of its kind and ends the experiment.
#[utoipa::path(post, path = "/v1/experiments/{id}/promote", tag = "experiments",
    params(("id" = u32, Path, description = "The experiment's id")),
    request_body = PromoteRequest,
    responses((status = 200, description = "Ended, the variant active", body = Experiment)))]
pub async fn promote(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Experiment>, ApiError> {
    state.refuse_if_draining()?;
    let id = experiment_id(&id)?;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<PromoteRequest>(&headers, body, MAX_EXPERIMENT_BODY_BYTES)
        .await?;
    let variant = request.variant.clone();
    let experiment = blocking(&state.policies, move |registry, now_ms| {
        Ok(registry.promote_experiment(id, &variant, now_ms)?)
    })
    .await?;
    state.scheduler.policies_changed();
    super::tokens::record(
        &state,
        &caller,
        "experiment.promote",
        format!("experiment {id}"),
        Some(format!("variant {}", request.variant)),
    )
    .await?;
    Ok(Json(experiment))
}
