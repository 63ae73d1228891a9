//! `GET /metrics`: every metric in the OpenMetrics text format, for Prometheus to scrape.

use super::{ApiError, AppState};
use crate::scheduler::{Clock, SystemClock};
use crate::telemetry::{OPENMETRICS_TEXT, Present};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// Every metric in the OpenMetrics text format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "OpenMetrics text", body = String,
        content_type = "application/openmetrics-text")))]
pub async fn scrape(State(state): State<AppState>) -> Result<Response, ApiError> {
    let workers = state.scheduler.workers().await?;
    let policies = state.policies.list();
    let snapshot = state.scheduler.snapshot();
    let present = Present {
        now_ms: SystemClock.now_ms(),
        snapshot: &snapshot,
        workers: &workers,
        policies: &policies,
    };
    let text = state
        .metrics
        .render(&present)
        .map_err(|_| ApiError::Internal("the metrics could not be encoded".into()))?;
    Ok(([(header::CONTENT_TYPE, OPENMETRICS_TEXT)], text).into_response())
}
