//! Workers' reports on their attempts: start, lease heartbeat, complete, fail, and stopped (the
//! answer to `attempt-cancelled`). Each carries the lease token the claim gave; a stale token is
//! refused with 409 and logged.

use super::AppState;
use super::batch::{BatchItem, BatchResponse};
use super::extract::{Decoded, SMALL_BODY_BYTES, TaskIdPath, decode_json};
use super::guard::Caller;
use super::problem::ApiError;
use crate::auth::Principal;
use axum::Json;
use axum::body::Body;
use axum::extract::State as Shared;
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::value::RawValue;
use sluice_engine::Report;
use sluice_model::{FailureClass, Role, TaskId, token_digest};
use sluice_wire::TaskView;

/// Reports one batch may carry.
pub const MAX_BATCH_REPORTS: usize = 1000;

/// A failure message is cut to this many bytes.
const MAX_MESSAGE_BYTES: usize = 4096;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenOnly {
    lease_token: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    lease_token: String,
    /// Kept with the task; at most `max_result_bytes` serialized.
    #[serde(default)]
    result: serde_json::Value,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    lease_token: String,
    class: FailureClass,
    #[serde(default)]
    message: String,
}

/// The worker began the attempt: the task turns running. 409 `stale-lease` for a token that no longer holds the task, 409
/// `attempt-cancelled` once it was cancelled.
#[utoipa::path(post, path = "/v1/tasks/{id}/start", tag = "workers",
    params(("id" = TaskId, Path, description = "The task's id")),
    request_body = TokenOnly,
    responses((status = 200, description = "The task after the report", body = TaskView)))]
pub async fn start(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<TaskView>, ApiError> {
    token_report(&state, &caller, id, &headers, raw, Report::Start).await
}

/// Extends the lease (never past the attempt timeout). 409 `stale-lease` for a token that no longer holds the task, 409
/// `attempt-cancelled` once it was cancelled.
#[utoipa::path(post, path = "/v1/tasks/{id}/heartbeat", tag = "workers",
    params(("id" = TaskId, Path, description = "The task's id")),
    request_body = TokenOnly,
    responses((status = 200, description = "The task after the report", body = TaskView)))]
pub async fn heartbeat(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<TaskView>, ApiError> {
    token_report(&state, &caller, id, &headers, raw, Report::Heartbeat).await
}

/// The worker stopped a cancelled or timed-out attempt, freeing its place. 409 `stale-lease` for a token that no longer holds the task, 409
/// `attempt-cancelled` once it was cancelled.
#[utoipa::path(post, path = "/v1/tasks/{id}/stopped", tag = "workers",
    params(("id" = TaskId, Path, description = "The task's id")),
    request_body = TokenOnly,
    responses((status = 200, description = "The task after the report", body = TaskView)))]
pub async fn stopped(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<TaskView>, ApiError> {
    token_report(&state, &caller, id, &headers, raw, Report::Stopped).await
}

/// A report whose body is only the lease token.
async fn token_report(
    state: &AppState,
    caller: &Principal,
    id: TaskId,
    headers: &HeaderMap,
    raw: Body,
    report: Report,
) -> Result<Json<TaskView>, ApiError> {
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<TokenOnly>(headers, raw, SMALL_BODY_BYTES)
        .await?;
    check_holder(state, caller, id, &request.lease_token)?;
    let task = state
        .scheduler
        .report(id, request.lease_token, report)
        .await?;
    Ok(Json(task.into()))
}

/// The attempt succeeded, with its result. 409 `stale-lease` for a token that no longer holds the task, 409
/// `attempt-cancelled` once it was cancelled.
#[utoipa::path(post, path = "/v1/tasks/{id}/complete", tag = "workers",
    params(("id" = TaskId, Path, description = "The task's id")),
    request_body = CompleteRequest,
    responses((status = 200, description = "The task after the report", body = TaskView)))]
pub async fn complete(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<TaskView>, ApiError> {
    let limit = state.limits.max_result_bytes + 64 * 1024;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<CompleteRequest>(&headers, raw, limit)
        .await?;
    let result = bounded_result(request.result, state.limits.max_result_bytes)?;
    check_holder(&state, &caller, id, &request.lease_token)?;
    let task = state
        .scheduler
        .report(id, request.lease_token, Report::Complete { result })
        .await?;
    Ok(Json(task.into()))
}

/// The attempt failed; the retry policy decides what follows. 409 `stale-lease` for a token that no longer holds the task, 409
/// `attempt-cancelled` once it was cancelled.
#[utoipa::path(post, path = "/v1/tasks/{id}/fail", tag = "workers",
    params(("id" = TaskId, Path, description = "The task's id")),
    request_body = FailRequest,
    responses((status = 200, description = "The task after the report", body = TaskView)))]
pub async fn fail(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<TaskView>, ApiError> {
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<FailRequest>(&headers, raw, SMALL_BODY_BYTES)
        .await?;
    if request.class == FailureClass::LeaseExpired {
        return Err(ApiError::InvalidRequest(
            "class lease-expired is the scheduler's to give; use transient, node-busy, timeout, permanent or invalid-input".into(),
        ));
    }
    let message = bounded_message(request.message);
    check_holder(&state, &caller, id, &request.lease_token)?;
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
    Ok(Json(task.into()))
}

/// A worker token reports only on the leases it was given: a lease of another worker's is
/// answered as if the task did not exist. (A token no lease of the task has is left to the
/// engine, which answers it as stale.)
fn check_holder(
    state: &AppState,
    caller: &Principal,
    id: TaskId,
    lease_token: &str,
) -> Result<(), ApiError> {
    if caller.role != Role::Worker {
        return Ok(());
    }
    let task = state.scheduler.task(id)?;
    let holder = match &task.lease {
        Some(lease) if lease.token == lease_token => Some(lease.worker.as_str()),
        _ => {
            let digest = token_digest(lease_token);
            task.retired_leases
                .iter()
                .find(|retired| retired.token_sha256 == digest)
                .map(|retired| retired.worker.as_str())
        }
    };
    match holder {
        Some(worker) if Some(worker) != caller.worker.as_deref() => Err(ApiError::TaskNotFound(id)),
        _ => Ok(()),
    }
}

/// A result within `limit` bytes serialized, or the refusal: results live in the task record,
/// which every later read and write of the task carries.
fn bounded_result(result: serde_json::Value, limit: usize) -> Result<serde_json::Value, ApiError> {
    let size = serde_json::to_vec(&result)
        .map_err(|e| ApiError::InvalidRequest(format!("the result cannot be encoded: {e}")))?
        .len();
    if size > limit {
        return Err(ApiError::ResultTooLarge { size, limit });
    }
    Ok(result)
}

fn bounded_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// One item of `POST /v1/reports`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(tag = "report", rename_all = "snake_case", deny_unknown_fields)]
enum BatchItemRequest {
    Start {
        task: TaskId,
        lease_token: String,
    },
    Heartbeat {
        task: TaskId,
        lease_token: String,
    },
    Stopped {
        task: TaskId,
        lease_token: String,
    },
    Complete {
        task: TaskId,
        lease_token: String,
        #[serde(default)]
        result: serde_json::Value,
    },
    Fail {
        task: TaskId,
        lease_token: String,
        class: FailureClass,
        #[serde(default)]
        message: String,
    },
}

impl BatchItemRequest {
    fn into_report(self, max_result_bytes: usize) -> Result<(TaskId, String, Report), ApiError> {
        Ok(match self {
            BatchItemRequest::Start { task, lease_token } => (task, lease_token, Report::Start),
            BatchItemRequest::Heartbeat { task, lease_token } => {
                (task, lease_token, Report::Heartbeat)
            }
            BatchItemRequest::Stopped { task, lease_token } => (task, lease_token, Report::Stopped),
            BatchItemRequest::Complete {
                task,
                lease_token,
                result,
            } => {
                let result = bounded_result(result, max_result_bytes)?;
                (task, lease_token, Report::Complete { result })
            }
            BatchItemRequest::Fail {
                task,
                lease_token,
                class,
                message,
            } => {
                if class == FailureClass::LeaseExpired {
                    return Err(ApiError::InvalidRequest(
                        "class lease-expired is the scheduler's to give".into(),
                    ));
                }
                let message = bounded_message(message);
                (task, lease_token, Report::Fail { class, message })
            }
        })
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportBatchRequest {
    /// At most 1,000 reports, each answered on its own.
    #[schema(value_type = Vec<BatchItemRequest>)]
    reports: Vec<Box<RawValue>>,
}

/// `POST /v1/reports`: many reports in one request (a worker finishing a batch of tasks at
/// once), one durable write for all; each is judged and answered on its own, in order.
#[utoipa::path(post, path = "/v1/reports", tag = "workers",
    request_body = ReportBatchRequest,
    responses((status = 200, description = "One result per report, in order", body = BatchResponse)))]
pub async fn batch(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    raw: Body,
) -> Result<Json<BatchResponse>, ApiError> {
    let limit = state.limits.batch_body_bytes;
    let Decoded {
        value: request,
        _budget,
    } = state
        .read_json::<ReportBatchRequest>(&headers, raw, limit)
        .await?;
    if request.reports.len() > MAX_BATCH_REPORTS {
        return Err(ApiError::InvalidRequest(format!(
            "a batch holds at most {MAX_BATCH_REPORTS} reports; this one has {}",
            request.reports.len()
        )));
    }
    let max_result_bytes = state.limits.max_result_bytes;
    let prepared = request
        .reports
        .iter()
        .map(|raw| {
            decode_json::<BatchItemRequest>(raw.get().as_bytes())
                .and_then(|item| item.into_report(max_result_bytes))
                .and_then(|(id, token, report)| {
                    check_holder(&state, &caller, id, &token)?;
                    Ok((id, token, report))
                })
        })
        .collect();
    let scheduler = &state.scheduler;
    let results = super::batch::answer_in_order(
        prepared,
        |valid| async move { Ok(scheduler.report_many(valid).await?) },
        |answer| match answer {
            Ok(task) => BatchItem::task(200, task, false),
            Err(error) => BatchItem::from_error(error.into()),
        },
        BatchItem::from_error,
    )
    .await?;
    Ok(Json(BatchResponse { results }))
}
