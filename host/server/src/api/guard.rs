//! Who may call which route, checked before any handler runs: the table of roles per route,
//! the middleware that finds a request's principal from its bearer token and holds devices to
//! their request rate, and the `Caller` extractor handlers scope their answers by.

use super::problem::ApiError;
use crate::auth::{Gate, Principal};
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::{Method, header, request::Parts};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};
use sluice_model::Role;
use std::num::NonZeroU32;
use std::sync::Arc;

const ANY: &[Role] = &Role::ALL;
const READERS: &[Role] = &[Role::Admin, Role::Viewer];
const TASK_READERS: &[Role] = &[Role::Admin, Role::Viewer, Role::Device];
const SUBMITTERS: &[Role] = &[Role::Admin, Role::Device];
const WORKERS: &[Role] = &[Role::Admin, Role::Worker];
const ADMINS: &[Role] = &[Role::Admin];
const COLLECTION_READERS: &[Role] = &[Role::Admin, Role::Viewer, Role::Worker, Role::Device];

/// What a route asks of its callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// No token: the liveness probe, and the status page's shell and assets (which hold no
    /// data; the page asks for a token before it reads any).
    Public,
    Roles(&'static [Role]),
}

/// The roles that may call `method` on the route template `route` (`None`: no route matched,
/// which any valid token may learn).
pub fn need(method: &Method, route: Option<&str>) -> Need {
    let Some(route) = route else {
        return Need::Roles(ANY);
    };
    let get = *method == Method::GET || *method == Method::HEAD;
    let roles = match route {
        "/healthz" => return Need::Public,
        "/" | "/assets/{file}" | "/v1/openapi.json" if get => return Need::Public,
        "/readyz" => ANY,
        "/metrics" | "/v1/stats" | "/v1/stats/history" | "/v1/events" | "/v1/workers"
        | "/v1/worker-events" => READERS,
        // Researchers read reports; starting, stopping and promoting are an administrator's.
        "/v1/experiments" | "/v1/experiments/{id}" | "/v1/rollouts" | "/v1/rollouts/{id}"
            if get =>
        {
            READERS
        }
        // Setting and removing limits is an administrator's.
        "/v1/concurrency-limits" if get => READERS,
        // Declaring a collection is an administrator's; its shard workers read its layout.
        "/v1/collections" | "/v1/collections/{name}" if get => COLLECTION_READERS,
        "/v1/tasks" if get => TASK_READERS,
        "/v1/tasks" | "/v1/tasks:batch" | "/v1/tasks/{id}/cancel" => SUBMITTERS,
        "/v1/tasks/{id}" | "/v1/tasks/{id}/events" => TASK_READERS,
        "/v1/tasks/{id}/start"
        | "/v1/tasks/{id}/heartbeat"
        | "/v1/tasks/{id}/complete"
        | "/v1/tasks/{id}/fail"
        | "/v1/tasks/{id}/stopped"
        | "/v1/reports"
        | "/v1/workers/{id}/heartbeat"
        | "/v1/workers/{id}/claim" => WORKERS,
        // Policies decide for every site: reading them is an administrator's business too.
        _ if route.starts_with("/v1/policies")
            || route.starts_with("/v1/tokens")
            || route == "/v1/audit"
            || route == "/v1/workers/{id}/reset" =>
        {
            ADMINS
        }
        // A route added without an entry here is an administrator's until it gets one.
        _ => ADMINS,
    };
    Need::Roles(roles)
}

/// Per-token request rate of device tokens: sustained `rate_per_s`, with bursts of `burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceRate {
    pub rate_per_s: NonZeroU32,
    pub burst: NonZeroU32,
}

/// The middleware's state: the token table and the devices' rate limiter.
#[derive(Clone)]
pub struct Guard {
    pub gate: Arc<Gate>,
    rate: DeviceRate,
    limiter: Arc<DefaultKeyedRateLimiter<String>>,
}

impl Guard {
    pub fn new(gate: Arc<Gate>, rate: DeviceRate) -> Guard {
        let quota = Quota::per_second(rate.rate_per_s).allow_burst(rate.burst);
        Guard {
            gate,
            rate,
            limiter: Arc::new(DefaultKeyedRateLimiter::keyed(quota)),
        }
    }

    fn admit(&self, request: &Request) -> Result<Option<Principal>, ApiError> {
        let route = request
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str);
        let Need::Roles(roles) = need(request.method(), route) else {
            return Ok(None);
        };
        let authorization = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let principal = self.gate.check(authorization)?;
        if !roles.contains(&principal.role) {
            return Err(ApiError::Forbidden(format!(
                "a {} token may not call {} {}",
                principal.role,
                request.method(),
                route.unwrap_or("this route")
            )));
        }
        if principal.role == Role::Device
            && let Err(not_until) = self.limiter.check_key(&principal.token_id)
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(ApiError::RateLimited {
                rate_per_s: self.rate.rate_per_s.get(),
                burst: self.rate.burst.get(),
                retry_after_s: wait.as_secs().saturating_add(1).min(u64::from(u32::MAX)) as u32,
            });
        }
        Ok(Some(principal))
    }
}

/// Finds the request's principal, checks its role against the route and, for a device, its
/// rate; then hands the request on with the principal in its extensions.
pub async fn authenticate(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    match guard.admit(&request) {
        Ok(principal) => {
            request
                .extensions_mut()
                .insert(principal.unwrap_or_else(Principal::open));
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

/// The principal a request acts as, for handlers that scope what they show or do by it.
pub struct Caller(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| ApiError::Internal("the route was reached without the guard".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_token_and_audit_routes_are_for_admins_only() {
        for (method, route) in [
            (Method::GET, "/v1/policies"),
            (Method::GET, "/v1/policies/{kind}"),
            (Method::PUT, "/v1/policies/{kind}"),
            (Method::POST, "/v1/policies/{kind}/activate"),
            (Method::POST, "/v1/policies/{kind}/rollback"),
            (Method::GET, "/v1/tokens"),
            (Method::POST, "/v1/tokens"),
            (Method::DELETE, "/v1/tokens/{id}"),
            (Method::GET, "/v1/audit"),
            (Method::POST, "/v1/workers/{id}/reset"),
        ] {
            assert_eq!(need(&method, Some(route)), Need::Roles(ADMINS), "{route}");
        }
        assert_eq!(need(&Method::GET, Some("/healthz")), Need::Public);
        assert_eq!(need(&Method::POST, Some("/")), Need::Roles(ADMINS));
        assert_eq!(need(&Method::GET, None), Need::Roles(ANY));
    }
}
