//! Rollout routes: start a guarded rollout of a policy version, list the rollouts, read one,
//! or stop one (the baseline decides for every task again). The steps themselves are taken
//! by `crate::rollout::drive`.

use super::AppState;
use super::extract::Decoded;
use super::guard::Caller;
use super::policies::blocking;
use super::problem::ApiError;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State as Shared};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sluice_model::{Rollout, RolloutSpec, RolloutState, rollouts};

/// The largest rollout body: ten steps and sixteen guards of 128 bytes fit in far less.
const MAX_ROLLOUT_BODY_BYTES: usize = 16 * 1024;

fn rollout_id(text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>()
        .ok()
        .filter(|&id| id > 0)
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "a rollout id is a whole number from 1; got `{}`",
                text.chars().take(32).collect::<String>()
            ))
        })
}

fn find(all: Vec<Rollout>, id: u32) -> Result<Rollout, ApiError> {
    all.into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| ApiError::ExperimentNotFound(format!("no rollout {id}")))
}

/// Starts a guarded rollout: the version decides for `steps[0]` % of new tasks (a live
/// experiment against the active version); after each `step_ms` the step's guards are judged
/// on its own tasks, and the version moves to the next share, becomes active after the last,
/// or is rolled back at once when a guard fails. One experiment or rollout per kind.
#[utoipa::path(post, path = "/v1/rollouts", tag = "experiments",
    request_body = RolloutSpec,
    responses((status = 201, description = "Started", body = Rollout)))]
pub async fn start(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    state.refuse_if_draining()?;
    let Decoded {
        value: spec,
        _budget,
    } = state
        .read_json::<RolloutSpec>(&headers, body, MAX_ROLLOUT_BODY_BYTES)
        .await?;
    let rollout = blocking(&state.policies, move |registry, now_ms| {
        let first = registry.start_rollout(spec, now_ms)?;
        Ok(rollouts(&registry.experiments()?)
            .into_iter()
            .find(|r| r.history.iter().any(|step| step.experiment == first.id)))
    })
    .await?
    .ok_or_else(|| ApiError::Internal("a rollout started but is not found".into()))?;
    super::tokens::record(
        &state,
        &caller,
        "rollout.start",
        format!("rollout {}", rollout.id),
        Some(format!(
            "{} v{} from v{}, steps {:?} of {} ms, guards: {}",
            rollout.kind,
            rollout.version,
            rollout.baseline_version,
            rollout.steps,
            rollout.step_ms,
            rollout.guards.join("; ")
        )),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(rollout)).into_response())
}

/// Every rollout, running and ended, oldest first.
#[utoipa::path(get, path = "/v1/rollouts", tag = "experiments",
    responses((status = 200, description = "The rollouts", body = Vec<Rollout>)))]
pub async fn list(Shared(state): Shared<AppState>) -> Result<Json<Vec<Rollout>>, ApiError> {
    let all = blocking(&state.policies, |registry, _| {
        Ok(rollouts(&registry.experiments()?))
    })
    .await?;
    Ok(Json(all))
}

/// One rollout: its state, its steps with how each guard was judged, and why it ended.
#[utoipa::path(get, path = "/v1/rollouts/{id}", tag = "experiments",
    params(("id" = u32, Path, description = "The rollout's id")),
    responses((status = 200, description = "The rollout", body = Rollout)))]
pub async fn detail(
    Shared(state): Shared<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Rollout>, ApiError> {
    let id = rollout_id(&id)?;
    let all = blocking(&state.policies, |registry, _| {
        Ok(rollouts(&registry.experiments()?))
    })
    .await?;
    Ok(Json(find(all, id)?))
}

/// Stops a running rollout: the baseline decides for every new task again.
#[utoipa::path(post, path = "/v1/rollouts/{id}/stop", tag = "experiments",
    params(("id" = u32, Path, description = "The rollout's id")),
    responses((status = 200, description = "Stopped", body = Rollout)))]
pub async fn stop(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<Rollout>, ApiError> {
    state.refuse_if_draining()?;
    let id = rollout_id(&id)?;
    let rollout = blocking(&state.policies, move |registry, now_ms| {
        let rollout = find(rollouts(&registry.experiments()?), id)?;
        let running = rollout
            .history
            .last()
            .filter(|step| rollout.state == RolloutState::Running && step.ended_at_ms.is_none())
            .ok_or_else(|| ApiError::PolicyConflict(format!("rollout {id} is not running")))?;
        registry.stop_experiment(running.experiment, now_ms)?;
        find(rollouts(&registry.experiments()?), id)
    })
    .await?;
    super::tokens::record(
        &state,
        &caller,
        "rollout.stop",
        format!("rollout {id}"),
        None,
    )
    .await?;
    Ok(Json(rollout))
}
