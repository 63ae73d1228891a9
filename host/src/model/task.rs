//! The stored task record and its view over the API.

use super::{Priority, Resources, State, TaskId};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a task ended badly (or why its last attempt failed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskError {
    pub class: String,
    pub message: String,
}

/// A task as stored and as shown by the API. The payload is stored beside it, not inside it, so
/// that state changes do not rewrite up to a MiB of payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub id: TaskId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub kind: String,
    pub priority: Priority,
    /// The bucket the task waits in now: as admitted, or higher after aging.
    pub bucket: Priority,
    /// Its order inside the bucket (lower first), as admitted.
    #[serde(default)]
    pub rank: u64,
    /// How long one attempt may run before it is failed as timed out, as admitted.
    #[serde(default)]
    pub attempt_timeout_ms: u64,
    pub device: String,
    pub tenant: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub est_exec_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// `created_at_ms + deadline_ms`, when a deadline was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at_ms: Option<u64>,
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    #[serde(default)]
    pub resources: Resources,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub attempt: u32,
    pub state: State,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TaskError>,
    /// The `seq` of each of its events, oldest first: the index from a task into the log.
    #[serde(default)]
    pub event_seqs: Vec<u64>,
}

/// Where a task waits and for how long one attempt may run: the priority policy's answer at
/// admission, an input to the engine like the time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    pub bucket: Priority,
    /// Order inside the bucket, lower first.
    pub rank: u64,
    pub attempt_timeout_ms: u64,
    /// The priority policy version that decided; none when the host's own rule did.
    pub policy_version: Option<u32>,
}

impl Admission {
    /// The host's own rule, for when no policy can answer: the submitted priority's bucket,
    /// arrival order, and twice the estimate per attempt.
    pub fn native(priority: Priority, est_exec_ms: u64, seq: u64) -> Admission {
        Admission {
            bucket: priority,
            rank: seq,
            attempt_timeout_ms: est_exec_ms.saturating_mul(2).max(1),
            policy_version: None,
        }
    }
}
