//! The HTTP API's request and response types that clients and the server share: a task as the
//! API shows it (`TaskView`), what a worker claims and is granted, the body that asks for a token, and the headers both sides name. The
//! server builds its routes on these; `sluice-client` speaks them without compiling the server.
//! The OpenAPI schemas (utoipa) are behind the `openapi` feature, which only the server turns on.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sluice_model::Role;

mod task;

pub use task::{
    CallbackView, FamilyPartView, FamilyView, LeaseView, RetiredLeaseView, TaskErrorView, TaskView,
};

/// Tasks one claim may ask for.
pub const MAX_CLAIM: usize = 64;

/// The header a policy upload carries its signature in.
pub const SIGNATURE_HEADER: &str = "sluice-signature";

/// One granted lease: the task (its record carries the lease), its payload, and the lease's
/// terms at the top level for convenience.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LeaseGrant {
    pub task: TaskView,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    pub payload: Option<Box<RawValue>>,
    pub attempt: u32,
    pub lease_token: String,
    pub lease_expires_at_ms: u64,
}

/// A claim for one GPU batch: up to `max_size` tasks of one kind, model and
/// `resources.batch_key`, on one GPU.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The most tasks of the batch (1 to 64, and no more than the claim's `max`).
    pub max_size: usize,
    /// How long a batch short of `max_size` may wait for more, counted from when its oldest
    /// task joined its bucket (at most 10000; each bucket's `batch_wait_ms` caps it, 0 for
    /// urgent by default, so urgent work never waits for a batch).
    #[serde(default)]
    pub max_wait_ms: u64,
    /// Only tasks of these models (at most 16; any model when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimRefusal {
    pub code: String,
    pub detail: String,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClaimResponse {
    pub leases: Vec<LeaseGrant>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<ClaimRefusal>,
    /// How long the long poll held this claim before the work it was granted was queued, in
    /// µs (0 when there was work at once). The rest of the claim's time is the server's.
    #[serde(default)]
    pub waited_for_work_us: u64,
}

/// The body of `POST /v1/tokens`.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub role: Option<Role>,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    #[serde(default)]
    pub worker: Option<String>,
    #[serde(default)]
    pub expires_in_s: Option<u64>,
}
