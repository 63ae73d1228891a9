//! Task routes: submit (one or a batch), read, list, timeline and cancel.

use super::AppState;
use super::batch::{BatchItem, BatchResponse};
use super::extract::{Decoded, TaskIdPath, decode_json, decode_query, read_json};
use super::guard::Caller;
use super::problem::ApiError;
use crate::auth::Principal;
use crate::scheduler::{SubmitResult, Submitted};
use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State as Shared};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sluice_model::{Event, Role, State, Submission, Task, TaskId, TaskSpec};
use sluice_store::ListQuery;
use sluice_wire::TaskView;
use tracing::Instrument;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const IDEMPOTENT_REPLAY: &str = "idempotent-replay";
pub const MAX_BATCH_TASKS: usize = 1000;
const MAX_LIST_LIMIT: usize = 1000;
const DEFAULT_LIST_LIMIT: usize = 100;
const LIST_SCAN_BUDGET: usize = 10_000;
pub(super) const MAX_EVENTS_LIMIT: usize = 10_000;
pub(super) const DEFAULT_EVENTS_LIMIT: usize = 1000;

/// A device's task is its own: the device and tenant come from its token, whatever the body
/// says.
/// `submission` as `caller` submitted it: a task an admin's token submitted is created in that
/// token's name, not the device's the body names.
fn attributed(mut submission: Submission, caller: &Principal) -> Submission {
    if caller.role != Role::Device && caller.token_id != crate::auth::OPEN_ID {
        submission.submitted_by = Some(caller.actor());
    }
    submission
}

fn as_submitted_by(mut spec: TaskSpec, caller: &Principal) -> TaskSpec {
    if caller.role == Role::Device {
        if let Some(device) = &caller.device {
            spec.device.clone_from(device);
        }
        if let Some(tenant) = &caller.tenant {
            spec.tenant.clone_from(tenant);
        }
    }
    spec
}

/// Task `id`, if `caller` may see it; another device's task is answered as missing, so ids
/// do not leak.
fn visible_task(state: &AppState, caller: &Principal, id: TaskId) -> Result<Task, ApiError> {
    let task = state.scheduler.task(id)?;
    if caller.sees(&task) {
        Ok(task)
    } else {
        Err(ApiError::TaskNotFound(id))
    }
}

/// Submits a task. With a key (`key` or the `Idempotency-Key` header) a resend with the same
/// body answers the same task (200, `Idempotent-Replay: true`); a device token's device and
/// tenant replace the body's.
#[utoipa::path(post, path = "/v1/tasks", tag = "tasks",
    request_body = TaskSpec,
    params(("Idempotency-Key" = Option<String>, Header, description = "An idempotency key, if the body has none")),
    responses(
        (status = 201, description = "Created", body = TaskView),
        (status = 200, description = "The task the key already named", body = TaskView),
    ))]
pub async fn submit(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    state.refuse_if_draining()?;
    let header_key = idempotency_header(&headers)?;
    let limits = &state.limits;
    let spec: Decoded<TaskSpec> = read_json(
        &headers,
        body,
        limits.body_bytes,
        limits.body_timeout,
        &state.body_budget,
    )
    .await?;
    let submission =
        as_submitted_by(spec.value, &caller).into_submission(header_key, &limits.task)?;
    let submission = attributed(submission, &caller);
    let span = tracing::debug_span!(
        target: crate::telemetry::TASK_SPANS,
        "submit",
        task_id = tracing::field::Empty,
        kind = %submission.spec.kind,
        device = %submission.spec.device,
    );
    let submitted = state
        .scheduler
        .submit(submission)
        .instrument(span.clone())
        .await?;
    span.record("task_id", tracing::field::display(submitted.task.id));
    Ok(submitted_response(submitted))
}

fn submitted_response(submitted: Submitted) -> Response {
    let status = if submitted.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let location = format!("/v1/tasks/{}", submitted.task.id);
    // A replayed task may be leased: its token is for the worker that claimed it, no one else.
    let mut response =
        (status, Json(TaskView::from(submitted.task.without_token()))).into_response();
    let headers = response.headers_mut();
    if let Ok(location) = HeaderValue::from_str(&location) {
        headers.insert(header::LOCATION, location);
    }
    if submitted.replayed {
        headers.insert(
            HeaderName::from_static(IDEMPOTENT_REPLAY),
            HeaderValue::from_static("true"),
        );
    }
    response
}

fn idempotency_header(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    match headers.get(IDEMPOTENCY_KEY) {
        None => Ok(None),
        Some(value) => value.to_str().map(|v| Some(v.to_owned())).map_err(|_| {
            ApiError::InvalidRequest("the Idempotency-Key header must be visible ASCII".into())
        }),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBatchRequest {
    /// At most 1,000 submissions, each answered on its own.
    #[schema(value_type = Vec<TaskSpec>)]
    tasks: Vec<Box<RawValue>>,
}

impl BatchItem {
    fn from_result(result: SubmitResult) -> Self {
        match result {
            Ok(submitted) => {
                let status = if submitted.replayed { 200 } else { 201 };
                BatchItem::task(status, submitted.task.without_token(), submitted.replayed)
            }
            Err(error) => BatchItem::from_error(error.into()),
        }
    }
}

/// Submits up to 1,000 tasks in one durable write; each item is answered in place.
#[utoipa::path(post, path = "/v1/tasks:batch", tag = "tasks",
    request_body = SubmitBatchRequest,
    responses((status = 200, description = "One result per item, in order", body = BatchResponse)))]
pub async fn submit_batch(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<BatchResponse>, ApiError> {
    state.refuse_if_draining()?;
    let limits = &state.limits;
    let decoded: Decoded<SubmitBatchRequest> = read_json(
        &headers,
        body,
        limits.batch_body_bytes,
        limits.body_timeout,
        &state.body_budget,
    )
    .await?;
    let request = &decoded.value;
    if request.tasks.len() > MAX_BATCH_TASKS {
        return Err(ApiError::BatchTooLarge {
            count: request.tasks.len(),
            max: MAX_BATCH_TASKS,
        });
    }
    let prepared = request
        .tasks
        .iter()
        .map(|raw| {
            decode_json::<TaskSpec>(raw.get().as_bytes()).and_then(|spec| {
                as_submitted_by(spec, &caller)
                    .into_submission(None, &limits.task)
                    .map(|submission| attributed(submission, &caller))
                    .map_err(ApiError::from)
            })
        })
        .collect();
    let scheduler = &state.scheduler;
    let results = super::batch::answer_in_order(
        prepared,
        |valid| async move { Ok(scheduler.submit_many(valid).await?) },
        BatchItem::from_result,
        BatchItem::from_error,
    )
    .await?;
    Ok(Json(BatchResponse { results }))
}

/// A task with its payload, as `GET /v1/tasks/{id}` shows it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TaskWithPayload {
    #[serde(flatten)]
    task: TaskView,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    payload: Option<Box<RawValue>>,
    /// Why a queued task is not being claimed although workers have room, when the
    /// scheduler knows: its concurrency key is at its limit, or no worker has a GPU with the
    /// memory it needs. Worked out when read, not stored.
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting_reason: Option<String>,
}

/// Why queued `task` waits, when something other than its turn holds it back.
fn waiting_reason(state: &AppState, task: &Task) -> Option<String> {
    if task.state != sluice_model::State::Queued {
        return None;
    }
    let snapshot = state.scheduler.snapshot();
    let needed_mb = task.resources.gpu_memory_mb;
    if let Some(largest_mb) = snapshot.largest_gpu_memory_mb
        && needed_mb > largest_mb
    {
        return Some(format!(
            "it needs {needed_mb} MB of GPU memory; the largest GPU of any worker has {largest_mb} MB"
        ));
    }
    let key = task.concurrency_key.as_deref()?;
    let limit = state.concurrency.limits().limit(key)?;
    let running = snapshot.keys_running.get(key).copied().unwrap_or(0);
    (running >= limit)
        .then(|| format!("concurrency key {key} is at its limit: {running} of {limit} running"))
}

/// One task with its payload. Another device's task is 404.
#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = TaskId, Path, description = "The task's id")),
    responses((status = 200, description = "The task", body = TaskWithPayload)))]
pub async fn get(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
) -> Result<Json<TaskWithPayload>, ApiError> {
    let task = visible_task(&state, &caller, id)?.without_token();
    let payload = stored_payload(&state, id)?;
    let waiting_reason = waiting_reason(&state, &task);
    Ok(Json(TaskWithPayload {
        task: task.into(),
        payload,
        waiting_reason,
    }))
}

/// A task's payload as stored: JSON, passed through without re-encoding.
fn stored_payload(state: &AppState, id: TaskId) -> Result<Option<Box<RawValue>>, ApiError> {
    state
        .scheduler
        .payload(id)?
        .map(|bytes| payload_json(id, bytes))
        .transpose()
}

/// A stored payload as the JSON it was submitted as.
pub(super) fn payload_json(id: TaskId, bytes: Vec<u8>) -> Result<Box<RawValue>, ApiError> {
    String::from_utf8(bytes)
        .ok()
        .and_then(|text| RawValue::from_string(text).ok())
        .ok_or_else(|| ApiError::Internal(format!("stored payload of {id} is not JSON")))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    state: Option<State>,
    kind: Option<String>,
    device: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
}

/// A page size from the query: the default when absent, refused outside 1..=max.
pub(super) fn page_limit(
    requested: Option<usize>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match requested.unwrap_or(default) {
        limit @ 1.. if limit <= max => Ok(limit),
        _ => Err(ApiError::InvalidQuery(format!("limit must be 1 to {max}"))),
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ListResponse {
    tasks: Vec<TaskView>,
    next_after: Option<TaskId>,
}

/// A page of tasks in arrival order; a device token sees only its own.
#[utoipa::path(get, path = "/v1/tasks", tag = "tasks",
    params(ListParams),
    responses((status = 200, description = "A page of tasks", body = ListResponse)))]
pub async fn list(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<ListResponse>, ApiError> {
    let mut params: ListParams = decode_query(query.as_deref())?;
    if caller.role == Role::Device {
        // A device lists only its own tasks, whatever it asks for.
        params.device = caller.device.clone();
    }
    let limit = page_limit(params.limit, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT)?;
    let after = match params.after.as_deref() {
        Some(text) => Some(
            text.parse::<TaskId>()
                .map_err(|e| ApiError::InvalidQuery(e.to_string()))?,
        ),
        None => None,
    };
    let query = ListQuery {
        state: params.state,
        kind: params.kind,
        device: params.device,
        after,
        limit,
        scan_budget: LIST_SCAN_BUDGET,
    };
    let scheduler = state.scheduler.clone();
    let page = tokio::task::spawn_blocking(move || scheduler.list(&query))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(Json(ListResponse {
        tasks: page
            .tasks
            .into_iter()
            .filter(|task| caller.sees(task))
            .map(|task| task.without_token().into())
            .collect(),
        next_after: page.next_after,
    }))
}

/// `?after=&limit=` of an event page.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EventParams {
    pub after: Option<u64>,
    pub limit: Option<usize>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EventsResponse {
    events: Vec<Event>,
}

/// A task's timeline: its events after `after`, oldest first.
#[utoipa::path(get, path = "/v1/tasks/{id}/events", tag = "tasks",
    params(("id" = TaskId, Path, description = "The task's id"), EventParams),
    responses((status = 200, description = "The task's events", body = EventsResponse)))]
pub async fn events(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
    RawQuery(query): RawQuery,
) -> Result<Json<EventsResponse>, ApiError> {
    let params: EventParams = decode_query(query.as_deref())?;
    let limit = page_limit(params.limit, DEFAULT_EVENTS_LIMIT, MAX_EVENTS_LIMIT)?;
    visible_task(&state, &caller, id)?;
    let events = state
        .scheduler
        .events(id, params.after.unwrap_or(0), limit)?;
    Ok(Json(EventsResponse { events }))
}

/// Cancels a task that has not ended; a worker holding it is told at its next report.
#[utoipa::path(post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = TaskId, Path, description = "The task's id")),
    responses((status = 200, description = "The cancelled task", body = TaskView)))]
pub async fn cancel(
    Shared(state): Shared<AppState>,
    Caller(caller): Caller,
    TaskIdPath(id): TaskIdPath,
) -> Result<Json<TaskView>, ApiError> {
    visible_task(&state, &caller, id)?;
    let task = state.scheduler.cancel(id, caller.actor()).await?;
    Ok(Json(task.without_token().into()))
}
