//! Who may call the API: roles, the stored record of a bearer token (its hash, never the token),
//! and the audit log's entries.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What a token may do. `Device` and `Worker` tokens are bound to one device (and tenant) or
/// one worker, and see only what belongs to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, including policies, tokens and worker resets.
    Admin,
    /// Reads: tasks, events, workers, policies, metrics, the status page.
    Viewer,
    /// Submits, reads and cancels the tasks of its own device.
    Device,
    /// Heartbeats and claims as its own worker, and reports on the leases it holds.
    Worker,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Admin, Role::Viewer, Role::Device, Role::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Viewer => "viewer",
            Role::Device => "device",
            Role::Worker => "worker",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A token as the store keeps it: the SHA-256 of the token's text, with what it is bound to.
/// Revoked tokens stay listed (with `revoked_at_ms`) so the audit log's ids keep meaning.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Lower-case hex SHA-256 of the token.
    pub sha256: String,
    pub created_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<u64>,
    /// The id of the admin token that issued it.
    pub issued_by: String,
}

impl TokenRecord {
    /// Whether the token is accepted at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.revoked_at_ms.is_none() && self.expires_at_ms.is_none_or(|end| now_ms < end)
    }
}

/// One admin action, as `GET /v1/audit` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEvent {
    /// Assigned by the store: one past the newest entry.
    pub seq: u64,
    pub at_ms: u64,
    /// The acting token's id (`bootstrap` for `SLUICE_ADMIN_TOKEN`, `open` when auth is off).
    pub token_id: String,
    pub role: Role,
    /// What was done: `token.issue`, `token.revoke`, `policy.upload`, `policy.activate`,
    /// `policy.rollback`, `worker.reset`.
    pub action: String,
    /// What it was done to: a token id, a policy kind and version, a worker id.
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
