//! A follower replica's API: every request is sent on to the leader (the replica that holds
//! the lease and runs the engine) and its answer streamed back, so a device or worker may talk
//! to any replica. Only the leader's engine decides; a follower keeps no state of its own.

use super::{ApiError, bound_exceeded};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sluice_store::StoreError;
use sluice_store_postgres::{LeaderInfo, PgStore};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set on every request a follower sends on: a follower that receives one answers 503 rather
/// than forwarding it again, so two replicas that each think the other leads cannot loop.
pub const FORWARDED_BY: &str = "sluice-forwarded-by";

/// How long a follower trusts what it last read of the lease row.
const LEADER_CACHE_MS: u64 = 250;

/// Headers of one connection, not of the request (RFC 9110 §7.6.1): not sent on.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// Where the leader is, read from the lease row and cached briefly.
pub struct Forwarder {
    store: Arc<PgStore>,
    /// This replica's lease holder name: a lease naming it means this replica is taking over.
    holder: String,
    /// This replica's own address, sent with each forwarded request.
    address: HeaderValue,
    /// `https` when the replicas serve TLS: a follower then redirects (307) to the leader
    /// instead of forwarding, since it would need the leader's certificate to be valid for the
    /// address in the lease row.
    tls: bool,
    client: Client<HttpConnector, Body>,
    cached: Mutex<Option<(LeaderInfo, Instant)>>,
}

impl Forwarder {
    pub fn new(store: Arc<PgStore>, holder: String, address: &str, tls: bool) -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        Forwarder {
            store,
            holder,
            address: HeaderValue::from_str(address).unwrap_or(HeaderValue::from_static("?")),
            tls,
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
            cached: Mutex::new(None),
        }
    }

    /// The leader, from the cache when it is fresh.
    async fn leader(&self) -> Result<LeaderInfo, ApiError> {
        if let Ok(cached) = self.cached.lock()
            && let Some((info, read_at)) = cached.as_ref()
            && read_at.elapsed() < Duration::from_millis(LEADER_CACHE_MS)
        {
            return Ok(info.clone());
        }
        let store = self.store.clone();
        let info = tokio::task::spawn_blocking(move || store.leader())
            .await
            .map_err(|e| ApiError::Internal(format!("reading the leader lease: {e}")))?
            .map_err(|e: StoreError| {
                ApiError::NoLeader(format!("cannot read the leader lease: {e}"))
            })?;
        if let Ok(mut cached) = self.cached.lock() {
            *cached = Some((info.clone(), Instant::now()));
        }
        Ok(info)
    }

    /// Forgets the cached leader, after it failed to answer: the next request reads the row.
    fn forget(&self) {
        if let Ok(mut cached) = self.cached.lock() {
            *cached = None;
        }
    }
}

/// The follower's router: one handler for every path, under the same bounds as the leader's
/// API (requests in flight and the request timeout).
pub fn router(forwarder: Arc<Forwarder>, limits: &super::ApiLimits) -> Router {
    let request_timeout_s = limits.request_timeout.as_secs();
    let bounds = tower::ServiceBuilder::new()
        .layer(axum::error_handling::HandleErrorLayer::new(
            move |error: tower::BoxError| async move { bound_exceeded(error, request_timeout_s) },
        ))
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
            limits.max_requests_in_flight,
        ))
        .timeout(limits.request_timeout);
    Router::new()
        .fallback(forward)
        .with_state(forwarder)
        .layer(bounds)
}

async fn forward(State(forwarder): State<Arc<Forwarder>>, mut request: Request) -> Response {
    if request.headers().contains_key(FORWARDED_BY) {
        return ApiError::NoLeader(
            "this request was forwarded to a replica that does not lead either; retry shortly"
                .into(),
        )
        .into_response();
    }
    let leader = match forwarder.leader().await {
        Ok(leader) => leader,
        Err(error) => return error.into_response(),
    };
    if leader.holder == forwarder.holder {
        return ApiError::NoLeader(
            "this replica has just taken the leader lease and is rebuilding the engine; retry shortly"
                .into(),
        )
        .into_response();
    }
    if !leader.live || leader.address.is_empty() {
        return ApiError::NoLeader(
            "no replica holds the leader lease (another takes it over within a few seconds); retry shortly"
                .into(),
        )
        .into_response();
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .to_owned();
    if forwarder.tls {
        let location = format!("https://{}{path}", leader.address);
        return match HeaderValue::from_str(&location) {
            Ok(location) => (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [(header::LOCATION, location)],
            )
                .into_response(),
            Err(_) => ApiError::NoLeader(format!(
                "the leader's address {:?} is not a valid URL",
                leader.address
            ))
            .into_response(),
        };
    }
    let uri: Uri = match format!("http://{}{path}", leader.address).parse() {
        Ok(uri) => uri,
        Err(_) => {
            return ApiError::NoLeader(format!(
                "the leader's address {:?} is not a valid URL",
                leader.address
            ))
            .into_response();
        }
    };
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::HOST);
    headers.insert(FORWARDED_BY, forwarder.address.clone());
    match forwarder.client.request(request).await {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            for name in HOP_BY_HOP {
                parts.headers.remove(name);
            }
            Response::from_parts(parts, Body::new(body))
        }
        Err(error) => {
            forwarder.forget();
            tracing::debug!(%error, leader = %leader.address, "forwarding failed");
            ApiError::NoLeader(format!(
                "the leader at {} did not answer ({error}); retry shortly",
                leader.address
            ))
            .into_response()
        }
    }
}
