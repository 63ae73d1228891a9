//! Events: the append-only record of every change of a task's state.

use super::{State, TaskId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Who caused a change: `device:<id>`, `worker:<id>`, `api`, `scheduler`, ...
/// Carried on every transition so audit and authorisation can name the actor later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(transparent)]
pub struct Actor(String);

impl Actor {
    pub fn new(name: impl Into<String>) -> Self {
        Actor(name.into())
    }

    pub fn scheduler() -> Self {
        Actor::new("scheduler")
    }

    pub fn api() -> Self {
        Actor::new("api")
    }

    pub fn device(device: &str) -> Self {
        Actor(format!("device:{device}"))
    }

    pub fn worker(worker: &str) -> Self {
        Actor(format!("worker:{worker}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry of the event log. `seq` is global, gap-free and strictly increasing; `from` is
/// absent for the event that creates a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Event {
    pub seq: u64,
    pub task_id: TaskId,
    pub from: Option<State>,
    pub to: State,
    pub actor: Actor,
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
