//! Worker routes: heartbeats, claims (long-polled, bounded), the worker table, breaker resets
//! and the worker log.

use super::AppState;
use super::extract::{Decoded, SMALL_BODY_BYTES, WorkerIdPath, decode_query};
use super::problem::ApiError;
use super::tasks::{DEFAULT_EVENTS_LIMIT, EventParams, MAX_EVENTS_LIMIT, page_limit};
use crate::engine::{NoClaim, WorkerView};
use crate::model::{Actor, Heartbeat, Task, WorkerEvent};
use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State as Shared};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::time::Duration;
use tokio::time::Instant;

/// Tasks one claim may ask for.
pub const MAX_CLAIM: usize = 64;
/// A waiting claim looks again at least this often, for work that frees up without a task
/// joining a queue (a GPU released by another lease, say).
const CLAIM_RECHECK: Duration = Duration::from_secs(1);

pub async fn heartbeat(
    Shared(state): Shared<AppState>,
    WorkerIdPath(worker): WorkerIdPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<WorkerView>, ApiError> {
    let Decoded {
        value: heartbeat,
        _budget,
    } = state
        .read_json::<Heartbeat>(&headers, body, SMALL_BODY_BYTES)
        .await?;
    heartbeat
        .validate()
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
    let mut views = state.scheduler.heartbeat(worker.clone(), heartbeat).await?;
    views
        .pop()
        .map(Json)
        .ok_or(ApiError::WorkerNotFound(worker))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    #[serde(default = "one")]
    max: usize,
    #[serde(default)]
    wait_ms: u64,
}

fn one() -> usize {
    1
}

/// One granted lease: the task (its record carries the lease), its payload, and the lease's
/// terms at the top level for convenience.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct LeaseGrant {
    pub task: Task,
    pub payload: Option<Box<RawValue>>,
    pub attempt: u32,
    pub lease_token: String,
    pub lease_expires_at_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClaimRefusal {
    pub code: String,
    pub detail: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClaimResponse {
    pub leases: Vec<LeaseGrant>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<ClaimRefusal>,
}

fn refusal(reason: &NoClaim) -> ClaimResponse {
    ClaimResponse {
        leases: Vec::new(),
        reason: Some(ClaimRefusal {
            code: reason.code().to_owned(),
            detail: reason.to_string(),
        }),
    }
}

pub async fn claim(
    Shared(state): Shared<AppState>,
    WorkerIdPath(worker): WorkerIdPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ClaimResponse>, ApiError> {
    let limits = &state.limits;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<ClaimRequest>(&headers, body, SMALL_BODY_BYTES)
        .await?;
    if !(1..=MAX_CLAIM).contains(&request.max) {
        return Err(ApiError::InvalidRequest(format!(
            "max must be 1 to {MAX_CLAIM}"
        )));
    }
    let max_wait_ms = limits.max_claim_wait.as_millis() as u64;
    if request.wait_ms > max_wait_ms {
        return Err(ApiError::InvalidRequest(format!(
            "wait_ms must be at most {max_wait_ms}"
        )));
    }
    let deadline = Instant::now() + Duration::from_millis(request.wait_ms);
    let work_queued = state.scheduler.work_queued();
    loop {
        if state.is_draining() {
            return Ok(Json(refusal(&NoClaim::Draining)));
        }
        // Armed before the claim, so a task queued while it runs still wakes this loop.
        let notified = work_queued.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let asked = Instant::now();
        let claimed = state.scheduler.claim(worker.clone(), request.max).await?;
        if let Some(reason) = &claimed.refused {
            return Ok(Json(refusal(reason)));
        }
        if !claimed.leases.is_empty() {
            state
                .metrics
                .pipeline
                .observe_claim_grant(asked.elapsed().as_secs_f64());
            let mut leases = Vec::with_capacity(claimed.leases.len());
            for task in claimed.leases {
                leases.push(grant(&state, task)?);
            }
            return Ok(Json(ClaimResponse {
                leases,
                reason: None,
            }));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(Json(ClaimResponse {
                leases: Vec::new(),
                reason: None,
            }));
        }
        let _ = tokio::time::timeout_at(deadline.min(now + CLAIM_RECHECK), notified).await;
    }
}

fn grant(state: &AppState, task: Task) -> Result<LeaseGrant, ApiError> {
    let lease = task
        .lease
        .clone()
        .ok_or_else(|| ApiError::Internal(format!("claimed task {} has no lease", task.id)))?;
    let payload = super::tasks::stored_payload(state, task.id)?;
    Ok(LeaseGrant {
        attempt: lease.attempt,
        lease_token: lease.token,
        lease_expires_at_ms: lease.expires_at_ms,
        payload,
        task,
    })
}

#[derive(Serialize)]
pub struct WorkersResponse {
    workers: Vec<WorkerView>,
}

pub async fn list(Shared(state): Shared<AppState>) -> Result<Json<WorkersResponse>, ApiError> {
    Ok(Json(WorkersResponse {
        workers: state.scheduler.workers().await?,
    }))
}

pub async fn reset(
    Shared(state): Shared<AppState>,
    WorkerIdPath(worker): WorkerIdPath,
) -> Result<Json<WorkerView>, ApiError> {
    let mut views = state
        .scheduler
        .reset_worker(worker.clone(), Actor::api())
        .await?;
    views
        .pop()
        .map(Json)
        .ok_or(ApiError::WorkerNotFound(worker))
}

#[derive(Serialize)]
pub struct WorkerEventsResponse {
    events: Vec<WorkerEvent>,
}

pub async fn events(
    Shared(state): Shared<AppState>,
    RawQuery(query): RawQuery,
) -> Result<Json<WorkerEventsResponse>, ApiError> {
    let params: EventParams = decode_query(query.as_deref())?;
    let limit = page_limit(params.limit, DEFAULT_EVENTS_LIMIT, MAX_EVENTS_LIMIT)?;
    let events = state
        .scheduler
        .worker_events(params.after.unwrap_or(0), limit)?;
    Ok(Json(WorkerEventsResponse { events }))
}
