//! Why an attempt failed, as workers report it and as the retry policy reads it.

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum FailureClass {
    Transient,
    NodeBusy,
    /// Set by the scheduler when a lease runs out; a worker may not report it.
    LeaseExpired,
    Timeout,
    Permanent,
    InvalidInput,
}

impl FailureClass {
    pub const ALL: [FailureClass; 6] = [
        FailureClass::Transient,
        FailureClass::NodeBusy,
        FailureClass::LeaseExpired,
        FailureClass::Timeout,
        FailureClass::Permanent,
        FailureClass::InvalidInput,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FailureClass::Transient => "transient",
            FailureClass::NodeBusy => "node-busy",
            FailureClass::LeaseExpired => "lease-expired",
            FailureClass::Timeout => "timeout",
            FailureClass::Permanent => "permanent",
            FailureClass::InvalidInput => "invalid-input",
        }
    }

    /// Whether the failure says something about the worker rather than the task: only those
    /// count against a worker's circuit breaker.
    pub fn blames_worker(self) -> bool {
        !matches!(self, FailureClass::Permanent | FailureClass::InvalidInput)
    }
}

impl fmt::Display for FailureClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
