//! The HTTP API: every route under one router, wrapped by the guard (tokens, roles, device
//! rates) and by the server-wide bounds (requests in flight, request time).

mod batch;
mod collections;
mod concurrency;
mod events;
mod experiments;
mod extract;
pub mod forward;
pub mod guard;
mod metrics;
mod openapi;
mod policies;
mod problem;
mod reports;
mod rollouts;
mod status_page;
mod tasks;
mod tokens;
mod workers;

pub use problem::{ApiError, PROBLEM_JSON, Problem};
pub use reports::MAX_BATCH_REPORTS;
pub use tasks::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAY, MAX_BATCH_TASKS};
pub use workers::{ClaimRefusal, ClaimResponse, LeaseGrant, MAX_CLAIM};

use crate::auth::Gate;
use crate::auth::signing::SigningKeys;
use crate::scheduler::Scheduler;
use crate::telemetry::{self, Metrics};
use axum::Router;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice_model::Limits;
use sluice_policy_runtime::PolicyRegistry;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Request bounds of the API.
#[derive(Clone, Debug)]
pub struct ApiLimits {
    pub task: Limits,
    /// A single submission's body: the payload limit plus room for the other fields.
    pub body_bytes: usize,
    pub batch_body_bytes: usize,
    /// A body that has not fully arrived after this long is refused, so a stalled client
    /// cannot hold a request open.
    pub body_timeout: Duration,
    /// Request bodies held in memory at once, across all requests, in bytes.
    pub inflight_body_bytes: usize,
    /// The largest policy component an upload may carry.
    pub policy_body_bytes: usize,
    /// The largest data blob a policy version may be given (all its blobs together, too).
    pub policy_data_bytes: usize,
    /// The longest a claim may wait for work.
    pub max_claim_wait: Duration,
    /// The largest `result` a complete report may carry, serialized; a single report's body
    /// may be this plus room for its other fields.
    pub max_result_bytes: usize,
    /// Requests being answered at once; past it, new ones get 503 at once rather than queue.
    /// Waiting claims count.
    pub max_requests_in_flight: usize,
    /// The longest a request may take, from its arrival to its answer's headers (a waiting
    /// claim included; a stream's body is not bounded by it).
    pub request_timeout: Duration,
    /// Each device token's sustained request rate and burst.
    pub device_rate: guard::DeviceRate,
}

impl ApiLimits {
    pub fn new(
        task: Limits,
        batch_body_bytes: usize,
        inflight_body_bytes: usize,
        policy_body_bytes: usize,
    ) -> Self {
        let body_bytes = task.max_payload_bytes + 64 * 1024;
        ApiLimits {
            task,
            body_bytes,
            batch_body_bytes,
            body_timeout: Duration::from_secs(30),
            inflight_body_bytes,
            policy_body_bytes,
            policy_data_bytes: sluice_policy_runtime::DEFAULT_MAX_DATA_BYTES,
            max_claim_wait: Duration::from_secs(30),
            max_result_bytes: 1024 * 1024,
            max_requests_in_flight: 4096,
            request_timeout: Duration::from_secs(60),
            device_rate: guard::DeviceRate {
                rate_per_s: std::num::NonZeroU32::new(100).unwrap_or(std::num::NonZeroU32::MIN),
                burst: std::num::NonZeroU32::new(200).unwrap_or(std::num::NonZeroU32::MIN),
            },
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub scheduler: Arc<Scheduler>,
    pub policies: Arc<PolicyRegistry>,
    pub limits: Arc<ApiLimits>,
    pub draining: Arc<AtomicBool>,
    /// Turns true when the server starts to drain, ending long-lived streams.
    pub drain: Arc<tokio::sync::watch::Sender<bool>>,
    pub body_budget: Arc<Semaphore>,
    pub metrics: Arc<Metrics>,
    /// Event streams open at once; past it, new ones are refused.
    pub event_streams: Arc<Semaphore>,
    /// Tokens: who a request acts as.
    pub gate: Arc<Gate>,
    /// The keys a policy upload must be signed by (none: signatures are not asked for).
    pub signing_keys: Arc<SigningKeys>,
    /// The concurrency limits in force, and those set through the API.
    pub concurrency: Arc<crate::concurrency_limits::LimitTable>,
    /// The vector collections declared through the API.
    pub collections: Arc<crate::collections::CollectionTable>,
}

/// What the API changes in the catalog beside policies and tokens, each with its copy in force.
pub struct CatalogTables {
    pub concurrency: Arc<crate::concurrency_limits::LimitTable>,
    pub collections: Arc<crate::collections::CollectionTable>,
}

impl AppState {
    pub fn new(
        scheduler: Arc<Scheduler>,
        policies: Arc<PolicyRegistry>,
        limits: ApiLimits,
        metrics: Arc<Metrics>,
        gate: Arc<Gate>,
        signing_keys: SigningKeys,
        tables: CatalogTables,
    ) -> Self {
        // Semaphore permits are u32 and capped by tokio; the budget is clamped to fit.
        let permits = limits
            .inflight_body_bytes
            .min(Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize);
        AppState {
            scheduler,
            policies,
            limits: Arc::new(limits),
            draining: Arc::new(AtomicBool::new(false)),
            drain: Arc::new(tokio::sync::watch::Sender::new(false)),
            body_budget: Arc::new(Semaphore::new(permits)),
            metrics,
            event_streams: Arc::new(Semaphore::new(events::MAX_STREAMS)),
            gate,
            signing_keys: Arc::new(signing_keys),
            concurrency: tables.concurrency,
            collections: tables.collections,
        }
    }

    /// Reads a JSON body of at most `limit_bytes` within the body timeout, holding its share
    /// of the body budget in the answer's `_budget` (keep it until the request is answered).
    async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        headers: &axum::http::HeaderMap,
        body: axum::body::Body,
        limit_bytes: usize,
    ) -> Result<extract::Decoded<T>, ApiError> {
        extract::read_json(
            headers,
            body,
            limit_bytes,
            self.limits.body_timeout,
            &self.body_budget,
        )
        .await
    }

    /// Reads a body of raw bytes of at most `limit_bytes`, as `read_json` reads JSON.
    async fn read_bytes(
        &self,
        headers: &axum::http::HeaderMap,
        body: axum::body::Body,
        limit_bytes: usize,
    ) -> Result<extract::Decoded<bytes::Bytes>, ApiError> {
        extract::read_body(
            headers,
            body,
            limit_bytes,
            self.limits.body_timeout,
            &self.body_budget,
        )
        .await
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    fn refuse_if_draining(&self) -> Result<(), ApiError> {
        if !self.is_draining() {
            return Ok(());
        }
        // A server stopping because a sync failed says so, not merely that it is draining:
        // the client learns the write was refused for the disk's sake.
        if let Some(reason) = self.scheduler.storage_failed().borrow().clone() {
            return Err(ApiError::StorageFailed(format!(
                "the store takes no more writes until a restart: {reason}"
            )));
        }
        Err(ApiError::Draining)
    }
}

pub fn router(state: AppState) -> Router {
    let http_metrics = state.metrics.http.clone();
    let guard = guard::Guard::new(state.gate.clone(), state.limits.device_rate);
    let request_timeout_s = state.limits.request_timeout.as_secs();
    let bounds = tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(
            move |error: tower::BoxError| async move { bound_exceeded(error, request_timeout_s) },
        ))
        .load_shed()
        // Global: `Router::layer` wraps each route on its own, and the bound is the server's.
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            state.limits.max_requests_in_flight,
        ))
        .timeout(state.limits.request_timeout);
    let (documented, doc) = documented_routes().split_for_parts();
    let document: Arc<str> = openapi::document(doc)
        .map(|json| json.to_string())
        .unwrap_or_else(|e| {
            format!("{{\"error\": \"the API document could not be encoded: {e}\"}}")
        })
        .into();
    Router::new()
        .route("/", get(status_page::index))
        .route("/assets/{file}", get(status_page::asset))
        .route(
            "/v1/openapi.json",
            get(move || {
                let document = document.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        document.to_string(),
                    )
                }
            }),
        )
        .merge(documented)
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        // Inside the router's own layers, so the matched route is known to the guard.
        .layer(axum::middleware::from_fn_with_state(
            guard,
            guard::authenticate,
        ))
        .layer(bounds)
        .layer(axum::middleware::from_fn_with_state(
            http_metrics,
            telemetry::track,
        ))
        .layer(CatchPanicLayer::custom(panic_response))
        // Server errors are logged where they are mapped to a problem (`problem.rs`), which
        // knows which ones repeat by the thousand (a full disk) and says those once.
        .layer(TraceLayer::new_for_http().on_failure(()))
}

/// Every documented route, mounted from its handler's `#[utoipa::path]`: the router and the
/// API document come from the same place.
fn documented_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics::scrape))
        .routes(routes!(stats))
        .routes(routes!(stats_history))
        .routes(routes!(events::follow))
        .routes(routes!(tasks::submit, tasks::list))
        .routes(routes!(tasks::submit_batch))
        .routes(routes!(tasks::get))
        .routes(routes!(tasks::events))
        .routes(routes!(tasks::cancel))
        .routes(routes!(reports::start))
        .routes(routes!(reports::heartbeat))
        .routes(routes!(reports::complete))
        .routes(routes!(reports::fail))
        .routes(routes!(reports::stopped))
        .routes(routes!(reports::batch))
        .routes(routes!(workers::list))
        .routes(routes!(workers::heartbeat))
        .routes(routes!(workers::claim))
        .routes(routes!(workers::reset))
        .routes(routes!(workers::events))
        .routes(routes!(policies::list))
        .routes(routes!(policies::upload, policies::detail))
        .routes(routes!(policies::activate))
        .routes(routes!(policies::rollback))
        .routes(routes!(policies::put_data))
        .routes(routes!(tokens::issue, tokens::list))
        .routes(routes!(tokens::revoke))
        .routes(routes!(tokens::audit))
        .routes(routes!(experiments::start, experiments::list))
        .routes(routes!(experiments::report))
        .routes(routes!(experiments::stop))
        .routes(routes!(experiments::promote))
        .routes(routes!(rollouts::start, rollouts::list))
        .routes(routes!(rollouts::detail))
        .routes(routes!(rollouts::stop))
        .routes(routes!(concurrency::list))
        .routes(routes!(concurrency::set, concurrency::remove))
        .routes(routes!(collections::list))
        .routes(routes!(
            collections::detail,
            collections::declare,
            collections::remove
        ))
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Status {
    status: String,
}

/// Liveness: answers while the process serves HTTP, without a token.
#[utoipa::path(get, path = "/healthz", tag = "operations", security(()),
    responses((status = 200, description = "Alive", body = Status)))]
async fn healthz() -> Response {
    axum::Json(serde_json::json!({"status": "ok"})).into_response()
}

/// Readiness: 503 `draining` once the server drains for shutdown.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready for work", body = Status)))]
async fn readyz(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    match state.refuse_if_draining() {
        Ok(()) => axum::Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(error) => error.into_response(),
    }
}

/// The engine's snapshot, with how long the task first in line of each bucket has waited.
#[utoipa::path(get, path = "/v1/stats", tag = "operations",
    responses((status = 200, description = "Counts by state and bucket, weights, the newest event seq", body = serde_json::Value)))]
async fn stats(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    let snapshot = state.scheduler.snapshot();
    let now_ms = crate::scheduler::Clock::now_ms(&crate::scheduler::SystemClock);
    let oldest_wait_ms_by_bucket: std::collections::BTreeMap<_, u64> = snapshot
        .first_in_line_created_at_ms
        .iter()
        .map(|(bucket, created_ms)| (*bucket, now_ms.saturating_sub(*created_ms)))
        .collect();
    let mut body = serde_json::to_value(snapshot.as_ref()).unwrap_or_default();
    if let Some(fields) = body.as_object_mut() {
        fields.insert(
            "oldest_wait_ms_by_bucket".into(),
            serde_json::to_value(oldest_wait_ms_by_bucket).unwrap_or_default(),
        );
        fields.insert("now_ms".into(), now_ms.into());
    }
    axum::Json(body).into_response()
}

/// The last 15 minutes, one sample an interval (`history_interval_ms`), oldest first: queued
/// tasks when each sample was taken, and the first claims in its interval with their waits'
/// p50 and p99, per bucket. What the status page's charts draw.
#[utoipa::path(get, path = "/v1/stats/history", tag = "operations",
    responses((status = 200, description = "Samples of the last 15 minutes", body = crate::telemetry::HistoryView)))]
async fn stats_history(axum::extract::State(state): axum::extract::State<AppState>) -> Response {
    axum::Json(state.metrics.tasks.history.view()).into_response()
}

async fn route_not_found(uri: Uri) -> ApiError {
    ApiError::RouteNotFound(uri.path().chars().take(256).collect())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// The answer to a request refused by the server-wide bounds: too many in flight (503 at
/// once, not queued) or out of its `timeout_s`.
fn bound_exceeded(error: tower::BoxError, timeout_s: u64) -> ApiError {
    if error.is::<tower::timeout::error::Elapsed>() {
        ApiError::RequestTimeout(timeout_s)
    } else if error.is::<tower::load_shed::error::Overloaded>() {
        ApiError::TooManyRequestsInFlight
    } else {
        ApiError::Internal(format!("request refused: {error}"))
    }
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::Internal("the request handler panicked".into()).into_response()
}
