//! The status page at `/`: static HTML, CSS and JS compiled into the binary, reading the same
//! JSON API as the CLI (`/v1/stats`, its history, `/v1/workers`, `/v1/policies`, `/v1/events`,
//! tasks).

use super::ApiError;
use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../../assets/status/index.html");
const APP_JS: &str = include_str!("../../assets/status/app.js");
const CHARTS_JS: &str = include_str!("../../assets/status/charts.js");
const APP_CSS: &str = include_str!("../../assets/status/app.css");

/// Nothing but this origin: the page loads no third-party code and sends data nowhere else.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

pub async fn index() -> Response {
    page(INDEX_HTML, "text/html; charset=utf-8")
}

pub async fn asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    match file.as_str() {
        "app.js" => Ok(page(APP_JS, "text/javascript; charset=utf-8")),
        "charts.js" => Ok(page(CHARTS_JS, "text/javascript; charset=utf-8")),
        "app.css" => Ok(page(APP_CSS, "text/css; charset=utf-8")),
        _ => Err(ApiError::RouteNotFound(format!(
            "/assets/{}",
            file.chars().take(64).collect::<String>()
        ))),
    }
}

fn page(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}
