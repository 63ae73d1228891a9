//! Worker routes: heartbeats, claims (long-polled, bounded), the worker table, breaker resets
//! and the worker log.

use super::AppState;
use super::extract::{Decoded, SMALL_BODY_BYTES, WorkerIdPath, decode_query};
use super::guard::Caller;
use super::problem::ApiError;
use super::tasks::{DEFAULT_EVENTS_LIMIT, EventParams, MAX_EVENTS_LIMIT, page_limit};
use crate::auth::Principal;
use crate::scheduler::ClaimAnswer;
use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State as Shared};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use sluice_engine::{BatchClaim, MAX_BATCH_MODELS, MAX_BATCH_WAIT_MS, NoClaim, WorkerView};
use sluice_model::{Heartbeat, WorkerEvent};
pub use sluice_wire::{BatchRequest, ClaimRefusal, ClaimResponse, LeaseGrant, MAX_CLAIM};
use std::time::Duration;
use tokio::time::Instant;

/// A waiting claim looks again at least this often, for work that frees up without a task
/// joining a queue (a GPU released by another lease, say).
const CLAIM_RECHECK: Duration = Duration::from_secs(1);

/// A worker token acts only as its own worker.
fn check_worker(caller: &Principal, worker: &str) -> Result<(), ApiError> {
    if caller.acts_as_worker(worker) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "this token is worker {}'s, not {worker}'s",
            caller.worker.as_deref().unwrap_or("?")
        )))
    }
}

/// Registers or refreshes a worker: its GPUs, labels, kinds and concurrency.
#[utoipa::path(post, path = "/v1/workers/{id}/heartbeat", tag = "workers",
    params(("id" = String, Path, description = "The worker's id")),
    request_body = Heartbeat,
    responses((status = 200, description = "The worker as the scheduler sees it", body = WorkerView)))]
pub async fn heartbeat(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    WorkerIdPath(worker): WorkerIdPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<WorkerView>, ApiError> {
    check_worker(&caller, &worker)?;
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

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The most tasks to lease (1 to 64); by default 1, or the batch's `max_size`.
    #[serde(default)]
    max: Option<usize>,
    #[serde(default)]
    wait_ms: u64,
    /// The worker's name for this claim (1 to 64 of `A-Z a-z 0-9 . _ : -`). A worker that
    /// gets no answer (the connection dropped, or the replica serving it died) sends the same
    /// claim again: it is answered with the leases that claim granted and the worker has not
    /// started, instead of leaving them to time out.
    #[serde(default)]
    claim_id: Option<String>,
    /// Claim one GPU batch: tasks of one kind, model and batch key, on one GPU. A batch short
    /// of its size waits (within `wait_ms`) for more, up to its `max_wait_ms`.
    #[serde(default)]
    batch: Option<BatchRequest>,
}

impl ClaimRequest {
    /// The most tasks to lease, and the batch asked for, checked.
    fn checked(&self) -> Result<(usize, Option<BatchClaim>), ApiError> {
        let batch_max = self.batch.as_ref().map(|b| b.max_size);
        if batch_max.is_some_and(|size| !(1..=MAX_CLAIM).contains(&size)) {
            return Err(ApiError::InvalidRequest(format!(
                "batch.max_size must be 1 to {MAX_CLAIM}"
            )));
        }
        let max = self.max.or(batch_max).unwrap_or(1);
        if !(1..=MAX_CLAIM).contains(&max) {
            return Err(ApiError::InvalidRequest(format!(
                "max must be 1 to {MAX_CLAIM}"
            )));
        }
        let Some(batch) = &self.batch else {
            return Ok((max, None));
        };
        if !(1..=max).contains(&batch.max_size) {
            return Err(ApiError::InvalidRequest(format!(
                "batch.max_size must be 1 to the claim's max ({max})"
            )));
        }
        if batch.max_wait_ms > MAX_BATCH_WAIT_MS {
            return Err(ApiError::InvalidRequest(format!(
                "batch.max_wait_ms must be at most {MAX_BATCH_WAIT_MS}"
            )));
        }
        if batch.models.len() > MAX_BATCH_MODELS {
            return Err(ApiError::InvalidRequest(format!(
                "batch.models may name at most {MAX_BATCH_MODELS} models"
            )));
        }
        for model in &batch.models {
            sluice_model::check_name("batch.models", model)
                .map_err(|e| ApiError::InvalidRequest(e.to_string()))?;
        }
        Ok((
            max,
            Some(BatchClaim {
                max_size: batch.max_size,
                max_wait_ms: batch.max_wait_ms,
                models: batch.models.clone(),
                may_hold: true,
            }),
        ))
    }
}

/// The longest `claim_id`.
const MAX_CLAIM_ID_BYTES: usize = 64;

fn valid_claim_id(claim_id: &str) -> bool {
    (1..=MAX_CLAIM_ID_BYTES).contains(&claim_id.len())
        && claim_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

fn refusal(reason: &NoClaim) -> ClaimResponse {
    ClaimResponse {
        leases: Vec::new(),
        reason: Some(ClaimRefusal {
            code: reason.code().to_owned(),
            detail: reason.to_string(),
        }),
        waited_for_work_us: 0,
    }
}

/// Leases up to `max` tasks to the worker, waiting up to `wait_ms` for work.
#[utoipa::path(post, path = "/v1/workers/{id}/claim", tag = "workers",
    params(("id" = String, Path, description = "The worker's id")),
    request_body = ClaimRequest,
    responses((status = 200, description = "The leases granted (none when the wait ran out), or why none can be", body = ClaimResponse)))]
pub async fn claim(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    WorkerIdPath(worker): WorkerIdPath,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ClaimResponse>, ApiError> {
    check_worker(&caller, &worker)?;
    let limits = &state.limits;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<ClaimRequest>(&headers, body, SMALL_BODY_BYTES)
        .await?;
    let (max, mut batch) = request.checked()?;
    if request
        .claim_id
        .as_deref()
        .is_some_and(|claim_id| !valid_claim_id(claim_id))
    {
        return Err(ApiError::InvalidRequest(format!(
            "claim_id must be 1 to {MAX_CLAIM_ID_BYTES} of A-Z a-z 0-9 . _ : -"
        )));
    }
    let max_wait_ms = limits.max_claim_wait.as_millis() as u64;
    if request.wait_ms > max_wait_ms {
        return Err(ApiError::InvalidRequest(format!(
            "wait_ms must be at most {max_wait_ms}"
        )));
    }
    let arrived = Instant::now();
    let deadline = arrived + Duration::from_millis(request.wait_ms);
    let work_queued = state.scheduler.work_queued();
    // When the work this claim may take appeared: its arrival, then each signal that woke it.
    let mut work_since = arrived;
    // When a batch short of its size was first held back to fill.
    let mut held_since: Option<Instant> = None;
    loop {
        if state.is_draining() {
            return Ok(Json(refusal(&NoClaim::Draining)));
        }
        // Read, then armed, before the claim: a task queued while it runs still wakes this
        // loop, and the signal after `seen` is the one that does.
        let seen = work_queued.sent();
        let notified = work_queued.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(batch) = &mut batch {
            // A claim whose wait has run out takes the batch as it is.
            batch.may_hold = Instant::now() < deadline;
        }
        let claimed = state
            .scheduler
            .claim(worker.clone(), max, request.claim_id.clone(), batch.clone())
            .await?;
        if let Some(reason) = &claimed.claimed.refused {
            return Ok(Json(refusal(reason)));
        }
        if !claimed.claimed.leases.is_empty() {
            let metrics = &state.metrics.pipeline;
            let tasks = claimed.claimed.leases.len();
            if batch.is_some() {
                let model = claimed.claimed.leases[0].resources.model.as_deref();
                let fill_wait_s = held_since.map_or(0.0, |since| since.elapsed().as_secs_f64());
                metrics.observe_batch(model, tasks, fill_wait_s);
            }
            let leases = grants(&state, claimed)?;
            metrics.observe_claim_grant(work_since.elapsed().as_secs_f64());
            metrics.observe_claim_tasks(tasks);
            return Ok(Json(ClaimResponse {
                leases,
                reason: None,
                waited_for_work_us: (work_since - arrived).as_micros() as u64,
            }));
        }
        let now = Instant::now();
        if now >= deadline && claimed.claimed.hold_ms.is_some() {
            // The wait ran out while a batch filled: once more, taking it as it is.
            continue;
        }
        if now >= deadline {
            return Ok(Json(ClaimResponse {
                leases: Vec::new(),
                reason: None,
                waited_for_work_us: 0,
            }));
        }
        // A batch filling is looked at again when its wait ends; other claims each second.
        let recheck = match claimed.claimed.hold_ms {
            Some(hold_ms) => {
                held_since.get_or_insert(now);
                Duration::from_millis(hold_ms).min(CLAIM_RECHECK)
            }
            None => CLAIM_RECHECK,
        };
        let signalled = tokio::time::timeout_at(deadline.min(now + recheck), notified)
            .await
            .is_ok();
        let woken = Instant::now();
        // Woken by a signal: the work appeared when it was sent (perhaps while this claim was
        // being planned just before it), and the wake-up itself is the server's time. Woken by
        // the recheck timer: no one knows, so count from now.
        work_since = if signalled {
            work_queued
                .sent_after(seen)
                .map(|sent| Instant::from_std(sent).clamp(work_since, woken))
                .unwrap_or(woken)
        } else {
            woken
        };
    }
}

/// The claimed tasks with their leases and payloads (those the writer did not hand over read
/// in one go).
fn grants(state: &AppState, mut answer: ClaimAnswer) -> Result<Vec<LeaseGrant>, ApiError> {
    let payloads = state.scheduler.lease_payloads(&mut answer)?;
    answer
        .claimed
        .leases
        .into_iter()
        .zip(payloads)
        .map(|(task, payload)| {
            let lease = task.lease.clone().ok_or_else(|| {
                ApiError::Internal(format!("claimed task {} has no lease", task.id))
            })?;
            Ok(LeaseGrant {
                attempt: lease.attempt,
                lease_token: lease.token,
                lease_expires_at_ms: lease.expires_at_ms,
                payload: payload
                    .map(|bytes| super::tasks::payload_json(task.id, bytes))
                    .transpose()?,
                task: task.into(),
            })
        })
        .collect()
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct WorkersResponse {
    workers: Vec<WorkerView>,
}

/// Every worker, with its health, breaker and free GPUs.
#[utoipa::path(get, path = "/v1/workers", tag = "workers",
    responses((status = 200, description = "The workers", body = WorkersResponse)))]
pub async fn list(Shared(state): Shared<AppState>) -> Result<Json<WorkersResponse>, ApiError> {
    Ok(Json(WorkersResponse {
        workers: state.scheduler.workers().await?,
    }))
}

/// Closes a worker's circuit breaker by hand (admin).
#[utoipa::path(post, path = "/v1/workers/{id}/reset", tag = "workers",
    params(("id" = String, Path, description = "The worker's id")),
    responses((status = 200, description = "The worker after the reset", body = WorkerView)))]
pub async fn reset(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    WorkerIdPath(worker): WorkerIdPath,
) -> Result<Json<WorkerView>, ApiError> {
    let mut views = state
        .scheduler
        .reset_worker(worker.clone(), caller.actor())
        .await?;
    let view = views
        .pop()
        .ok_or(ApiError::WorkerNotFound(worker.clone()))?;
    super::tokens::record(&state, &caller, "worker.reset", worker, None).await?;
    Ok(Json(view))
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct WorkerEventsResponse {
    events: Vec<WorkerEvent>,
}

/// The worker log: breaker changes after `after`.
#[utoipa::path(get, path = "/v1/worker-events", tag = "workers",
    params(EventParams),
    responses((status = 200, description = "A page of the worker log", body = WorkerEventsResponse)))]
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
