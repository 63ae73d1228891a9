//! Policy records: the kinds of decision a component can make, the versions a kind has been
//! given, and the log of what happened to them (upload, activation, rollback, deactivation).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The policy kinds, one WIT world each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    Priority,
    Aging,
    Retry,
    Split,
    Merge,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Priority,
        PolicyKind::Aging,
        PolicyKind::Retry,
        PolicyKind::Split,
        PolicyKind::Merge,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Priority => "priority",
            PolicyKind::Aging => "aging",
            PolicyKind::Retry => "retry",
            PolicyKind::Split => "split",
            PolicyKind::Merge => "merge",
        }
    }

    pub fn code(self) -> u8 {
        self as u8
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("no policy kind `{0}`; the kinds are priority, aging, retry, split and merge")]
pub struct UnknownKind(pub String);

impl FromStr for PolicyKind {
    type Err = UnknownKind;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        PolicyKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| UnknownKind(text.chars().take(64).collect()))
    }
}

/// Version 0 of every kind is the component embedded in the binary, with the server's config.
pub const BUILTIN_VERSION: u32 = 0;

/// One uploaded version of a kind: a component (by content hash) and the config its `init`
/// accepted. The same bytes with another config are another version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyVersion {
    pub kind: PolicyKind,
    pub version: u32,
    /// Hex SHA-256 of the component's bytes.
    pub sha256: String,
    pub config: String,
    pub size_bytes: u64,
    pub uploaded_at_ms: u64,
    /// The id of the trusted key whose signature the upload carried, when keys are set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// Memory and fuel per call granted at upload; absent: the server's defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_fuel: Option<u64>,
    /// The data blobs stored beside the component, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data: Vec<DataRef>,
}

/// One data blob of a version: its name, checksum and size (its bytes are stored apart).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DataRef {
    pub name: String,
    /// Hex SHA-256 of the bytes.
    pub sha256: String,
    pub size_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PolicyAction {
    Uploaded,
    Activated,
    RolledBack,
    /// Taken out of service by the runtime after too many faults.
    Deactivated,
    /// An experiment of the kind began (`reason` names it and its variants).
    ExperimentStarted,
    /// An experiment ended without changing the active version.
    ExperimentStopped,
    /// An experiment ended by making one of its variants the active version.
    ExperimentPromoted,
    /// A rollout's step passed its guards; the next step began (`reason` says how each
    /// guard was judged).
    RolloutAdvanced,
    /// A rollout's guard failed and the version was rolled back (`reason` says which and by
    /// how much).
    RolloutRolledBack,
}

/// An entry of the policy log. `from` and `to` are active versions (0 = built in).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PolicyEvent {
    pub seq: u64,
    pub kind: PolicyKind,
    pub action: PolicyAction,
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<u32>,
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// On an upload: the id of the key that signed the component.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
}
