//! The one place where errors become HTTP answers: RFC 9457 `application/problem+json` bodies
//! with a stable `type` per kind of error.

use crate::auth::AuthError;
use crate::auth::signing::SignatureError;
use crate::scheduler::SchedulerError;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_engine::StepError;
use sluice_model::{IdError, TaskId, UnknownKind, ValidationError};
use sluice_policy_runtime::{Check, RegistryError};
use sluice_store::StoreError;

pub const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidTask(ValidationError),
    #[error("the payload is {size} bytes; the limit is {limit}")]
    PayloadTooLarge { size: usize, limit: usize },
    #[error("the result is {size} bytes; the limit is {limit} (max_result_bytes)")]
    ResultTooLarge { size: usize, limit: usize },
    #[error("the body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error("a batch holds at most {max} tasks; this one has {count}")]
    BatchTooLarge { count: usize, max: usize },
    #[error("send the body as {0}")]
    UnsupportedMediaType(&'static str),
    #[error("the body did not arrive within {0} s")]
    BodyTimeout(u64),
    #[error("the body could not be read: {0}")]
    UnreadableBody(String),
    #[error(transparent)]
    InvalidId(#[from] IdError),
    #[error("{0}")]
    InvalidQuery(String),
    #[error("no task {0}")]
    TaskNotFound(TaskId),
    #[error("no route for {0}")]
    RouteNotFound(String),
    #[error("this route does not accept that method")]
    MethodNotAllowed,
    #[error(
        "idempotency key `{key}` already belongs to task {task_id}, submitted with another body"
    )]
    KeyConflict { key: String, task_id: TaskId },
    #[error("{0}")]
    InvalidTransition(String),
    #[error("{reason}")]
    StaleLease { task_id: TaskId, reason: String },
    #[error("{detail}")]
    AttemptCancelled { task_id: TaskId, detail: String },
    #[error("{detail}")]
    AttemptRevoked { task_id: TaskId, detail: String },
    #[error("no worker `{0}`: send a heartbeat first")]
    WorkerNotFound(String),
    #[error("the scheduler is at capacity; retry shortly")]
    Overloaded,
    #[error("the server is draining for shutdown; retry against another replica or later")]
    Draining,
    #[error("{0}")]
    NoLeader(String),
    #[error(transparent)]
    PolicyKindNotFound(#[from] UnknownKind),
    #[error("{0}")]
    PolicyVersionNotFound(String),
    #[error("the component failed the {check} check: {detail}")]
    PolicyRefused { check: Check, detail: String },
    #[error("{0}")]
    PolicyConflict(String),
    #[error("the split policy refused the task: {0}")]
    SplitRefused(String),
    #[error("{0}")]
    CollectionMismatch(String),
    #[error("no collection `{0}` was declared through the API")]
    CollectionNotFound(String),
    #[error("{0}")]
    PolicyUnavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("{0}")]
    StorageFailed(String),
    #[error("{0}")]
    InsufficientStorage(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    TokenNotFound(String),
    #[error("{0}")]
    ExperimentNotFound(String),
    #[error("no concurrency limit was set through the API on `{0}`")]
    ConcurrencyLimitNotFound(String),
    #[error("{0}")]
    InvalidToken(String),
    #[error("{0}")]
    TokenConflict(String),
    #[error(
        "this token sent more than {rate_per_s} requests a second (burst {burst}); retry in {retry_after_s} s"
    )]
    RateLimited {
        rate_per_s: u32,
        burst: u32,
        retry_after_s: u32,
    },
    #[error("the server is answering as many requests as it may at once; retry shortly")]
    TooManyRequestsInFlight,
    #[error("the request took longer than {0} s")]
    RequestTimeout(u64),
    #[error("events before {first_seq} were removed by retention; read on from after={}", first_seq - 1)]
    EventsGone { first_seq: u64 },
}

/// The body of an error answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `urn:sluice:problem:` and a stable slug (`task-not-found`, `unauthorized`,
    /// `rate-limited`, ...): the slugs, and when each is answered, are in docs/api.md#errors.
    #[serde(rename = "type")]
    #[schema(
        pattern = "^urn:sluice:problem:[a-z-]+$",
        example = "urn:sluice:problem:task-not-found"
    )]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<TaskId>,
    /// Which validation step refused a policy upload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub check: Option<Check>,
    /// Where the event log starts now, for a reader behind it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_seq: Option<u64>,
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            MalformedJson(_) => (StatusCode::BAD_REQUEST, "malformed-json", "Malformed JSON"),
            InvalidRequest(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-request",
                "Invalid request",
            ),
            InvalidTask(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-task",
                "Invalid task",
            ),
            PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                "Payload too large",
            ),
            ResultTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "result-too-large",
                "Result too large",
            ),
            BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "Body too large",
            ),
            BatchTooLarge { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "batch-too-large",
                "Batch too large",
            ),
            UnsupportedMediaType(_) => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "Unsupported media type",
            ),
            BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body-timeout", "Body timeout"),
            UnreadableBody(_) => (
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "Unreadable body",
            ),
            InvalidId(_) => (
                StatusCode::BAD_REQUEST,
                "invalid-task-id",
                "Invalid task id",
            ),
            InvalidQuery(_) => (StatusCode::BAD_REQUEST, "invalid-query", "Invalid query"),
            TaskNotFound(_) => (StatusCode::NOT_FOUND, "task-not-found", "Task not found"),
            RouteNotFound(_) => (StatusCode::NOT_FOUND, "route-not-found", "Not found"),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
            ),
            KeyConflict { .. } => (
                StatusCode::CONFLICT,
                "idempotency-conflict",
                "Idempotency key conflict",
            ),
            InvalidTransition(_) => (
                StatusCode::CONFLICT,
                "invalid-transition",
                "Invalid transition",
            ),
            StaleLease { .. } => (StatusCode::CONFLICT, "stale-lease", "Stale lease"),
            AttemptCancelled { .. } => (
                StatusCode::CONFLICT,
                "attempt-cancelled",
                "Attempt cancelled",
            ),
            AttemptRevoked { .. } => (StatusCode::CONFLICT, "attempt-revoked", "Attempt revoked"),
            WorkerNotFound(_) => (
                StatusCode::NOT_FOUND,
                "worker-not-found",
                "Worker not found",
            ),
            Overloaded => (StatusCode::SERVICE_UNAVAILABLE, "overloaded", "Overloaded"),
            Draining => (StatusCode::SERVICE_UNAVAILABLE, "draining", "Draining"),
            NoLeader(_) => (StatusCode::SERVICE_UNAVAILABLE, "no-leader", "No leader"),
            PolicyKindNotFound(_) => (
                StatusCode::NOT_FOUND,
                "policy-kind-not-found",
                "Policy kind not found",
            ),
            PolicyVersionNotFound(_) => (
                StatusCode::NOT_FOUND,
                "policy-version-not-found",
                "Policy version not found",
            ),
            PolicyRefused { .. } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "policy-refused",
                "Policy refused",
            ),
            PolicyConflict(_) => (StatusCode::CONFLICT, "policy-conflict", "Policy conflict"),
            ConcurrencyLimitNotFound(_) => (
                StatusCode::NOT_FOUND,
                "concurrency-limit-not-found",
                "Concurrency limit not found",
            ),
            SplitRefused(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "split-refused",
                "Split refused",
            ),
            CollectionMismatch(_) => (
                StatusCode::CONFLICT,
                "collection-mismatch",
                "Collection mismatch",
            ),
            CollectionNotFound(_) => (
                StatusCode::NOT_FOUND,
                "collection-not-found",
                "Collection not found",
            ),
            PolicyUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "policy-unavailable",
                "Policy unavailable",
            ),
            Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal error",
            ),
            StorageFailed(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "storage-failed",
                "Storage failed",
            ),
            InsufficientStorage(_) => (
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient-storage",
                "Insufficient storage",
            ),
            EventsGone { .. } => (StatusCode::GONE, "events-gone", "Events gone"),
            Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized"),
            Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            TokenNotFound(_) => (StatusCode::NOT_FOUND, "token-not-found", "Token not found"),
            ExperimentNotFound(_) => (
                StatusCode::NOT_FOUND,
                "experiment-not-found",
                "Experiment not found",
            ),
            InvalidToken(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-token-request",
                "Invalid token request",
            ),
            TokenConflict(_) => (StatusCode::CONFLICT, "token-conflict", "Token conflict"),
            RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "Rate limited",
            ),
            TooManyRequestsInFlight => (
                StatusCode::SERVICE_UNAVAILABLE,
                "too-many-requests-in-flight",
                "Too many requests in flight",
            ),
            RequestTimeout(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "request-timeout",
                "Request timeout",
            ),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    pub fn problem(&self) -> Problem {
        let (status, slug, title) = self.parts();
        let task_id = match self {
            ApiError::TaskNotFound(id) => Some(*id),
            ApiError::KeyConflict { task_id, .. } => Some(*task_id),
            ApiError::StaleLease { task_id, .. } => Some(*task_id),
            ApiError::AttemptCancelled { task_id, .. } => Some(*task_id),
            ApiError::AttemptRevoked { task_id, .. } => Some(*task_id),
            _ => None,
        };
        Problem {
            kind: format!("urn:sluice:problem:{slug}"),
            title,
            status: status.as_u16(),
            detail: self.to_string(),
            task_id,
            check: match self {
                ApiError::PolicyRefused { check, .. } => Some(*check),
                _ => None,
            },
            first_seq: match self {
                ApiError::EventsGone { first_seq } => Some(*first_seq),
                _ => None,
            },
        }
    }

    fn retry_after_s(&self) -> Option<u32> {
        match self {
            ApiError::Overloaded => Some(1),
            ApiError::Draining => Some(5),
            ApiError::NoLeader(_) => Some(1),
            ApiError::PolicyUnavailable(_) => Some(1),
            ApiError::InsufficientStorage(_) => Some(5),
            ApiError::RateLimited { retry_after_s, .. } => Some(*retry_after_s),
            ApiError::TooManyRequestsInFlight => Some(1),
            ApiError::RequestTimeout(_) => Some(1),
            _ => None,
        }
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        match error {
            ValidationError::PayloadTooLarge { size, limit } => {
                ApiError::PayloadTooLarge { size, limit }
            }
            other => ApiError::InvalidTask(other),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(error: AuthError) -> Self {
        match error {
            AuthError::Missing | AuthError::Malformed | AuthError::Refused => {
                ApiError::Unauthorized(error.to_string())
            }
            AuthError::Forbidden { .. } => ApiError::Forbidden(error.to_string()),
            AuthError::NotFound(_) => ApiError::TokenNotFound(error.to_string()),
            AuthError::Invalid(_) => ApiError::InvalidToken(error.to_string()),
            AuthError::Conflict(_) => ApiError::TokenConflict(error.to_string()),
            AuthError::Store(store) => (&store).into(),
        }
    }
}

impl From<SignatureError> for ApiError {
    fn from(error: SignatureError) -> Self {
        ApiError::PolicyRefused {
            check: Check::Signature,
            detail: error.to_string(),
        }
    }
}

impl From<SchedulerError> for ApiError {
    fn from(error: SchedulerError) -> Self {
        match error {
            SchedulerError::Overloaded => ApiError::Overloaded,
            SchedulerError::ShuttingDown => ApiError::Draining,
            SchedulerError::EventsGone { first_seq } => ApiError::EventsGone { first_seq },
            SchedulerError::Step(step) => step.into(),
        }
    }
}

impl From<StepError> for ApiError {
    fn from(error: StepError) -> Self {
        match error {
            StepError::NotFound(id) => ApiError::TaskNotFound(id),
            StepError::KeyConflict { key, task_id } => ApiError::KeyConflict { key, task_id },
            illegal @ StepError::Illegal { .. } => ApiError::InvalidTransition(illegal.to_string()),
            StepError::StaleLease {
                task_id, reason, ..
            } => ApiError::StaleLease { task_id, reason },
            cancelled @ StepError::AttemptCancelled { task_id, .. } => ApiError::AttemptCancelled {
                task_id,
                detail: cancelled.to_string(),
            },
            revoked @ StepError::AttemptRevoked { task_id, .. } => ApiError::AttemptRevoked {
                task_id,
                detail: revoked.to_string(),
            },
            StepError::UnknownWorker(worker) => ApiError::WorkerNotFound(worker),
            StepError::HeartbeatRefused(sluice_engine::HeartbeatRefused::TooManyWorkers {
                ..
            }) => ApiError::Overloaded,
            StepError::HeartbeatRefused(sluice_engine::HeartbeatRefused::CollectionMismatch(
                why,
            )) => ApiError::CollectionMismatch(why),
            StepError::SplitRefused(reason) => ApiError::SplitRefused(reason),
            StepError::InvalidTask(error) => ApiError::InvalidTask(error),
            StepError::Internal(detail) => ApiError::Internal(detail),
            StepError::PolicyUnavailable(reason) => ApiError::PolicyUnavailable(reason),
            StepError::Store(error) => (&*error).into(),
        }
    }
}

impl From<&StoreError> for ApiError {
    fn from(error: &StoreError) -> Self {
        match error {
            // Nothing was written; the same request succeeds once space is freed.
            full if full.is_full() => {
                ApiError::InsufficientStorage(format!("nothing was written: {full}"))
            }
            // The disk could not take or keep the write: not a bug, and not the client's.
            StoreError::Io(_) | StoreError::Failed(_) => {
                ApiError::StorageFailed(format!("the write was not made durable: {error}"))
            }
            _ => ApiError::Internal(error.to_string()),
        }
    }
}

impl From<crate::concurrency_limits::LimitError> for ApiError {
    fn from(error: crate::concurrency_limits::LimitError) -> Self {
        use crate::concurrency_limits::LimitError;
        match error {
            LimitError::Store(store) => ApiError::from(&store),
            too_many @ LimitError::TooMany => ApiError::InvalidRequest(too_many.to_string()),
        }
    }
}

impl From<RegistryError> for ApiError {
    fn from(error: RegistryError) -> Self {
        match error {
            RegistryError::Refused { check, detail } => ApiError::PolicyRefused { check, detail },
            unknown @ RegistryError::UnknownVersion { .. } => {
                ApiError::PolicyVersionNotFound(unknown.to_string())
            }
            unknown @ RegistryError::UnknownExperiment(_) => {
                ApiError::ExperimentNotFound(unknown.to_string())
            }
            RegistryError::ExperimentRefused(detail) => ApiError::InvalidRequest(detail),
            conflict @ (RegistryError::NothingToRollBack(_)
            | RegistryError::ExperimentConflict(_)
            | RegistryError::TooManyVersions { .. }
            | RegistryError::DataOfActivated { .. }) => {
                ApiError::PolicyConflict(conflict.to_string())
            }
            RegistryError::Store(error) if error.is_full() => (&error).into(),
            other @ (RegistryError::Builtin { .. }
            | RegistryError::Load { .. }
            | RegistryError::Store(_)) => ApiError::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = self.problem();
        // A full disk refuses every write until space is freed: the writer says so once, not
        // once a request.
        // So does a flood past the in-flight bound (its counter is in /metrics), and a
        // follower between leaders (the lease change is logged where it happens).
        let repeats = matches!(
            self,
            ApiError::InsufficientStorage(_)
                | ApiError::TooManyRequestsInFlight
                | ApiError::NoLeader(_)
        );
        if problem.status >= 500 && !repeats {
            tracing::error!(error = %self, "request failed");
        }
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (self.status(), body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after_s() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if matches!(self, ApiError::Unauthorized(_)) {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
        }
        response
    }
}
