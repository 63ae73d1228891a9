//! What a task is, by name — kind, tenant, device and labels — as the rules of a policy read it:
//! owned and shared by the queued entries that carry it, and borrowed for a decision.

use super::{Task, TaskSpec};
use std::collections::BTreeMap;

/// A queued task's names and labels. Every queued entry with the same ones shares one (`Arc`):
/// the queues intern them, so a million waiting tasks of a few hundred devices hold a few
/// hundred of these.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct TaskNames {
    pub kind: String,
    pub tenant: String,
    pub device: String,
    /// Also what a worker must carry to run it, each with the same value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A task's names, borrowed for one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NamesRef<'a> {
    pub kind: &'a str,
    pub tenant: &'a str,
    pub device: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

impl TaskNames {
    pub fn of(task: &Task) -> TaskNames {
        TaskNames {
            kind: task.kind.clone(),
            tenant: task.tenant.clone(),
            device: task.device.clone(),
            labels: task.labels.clone(),
        }
    }

    pub fn borrowed(&self) -> NamesRef<'_> {
        NamesRef {
            kind: &self.kind,
            tenant: &self.tenant,
            device: &self.device,
            labels: &self.labels,
        }
    }
}

impl<'a> From<&'a Task> for NamesRef<'a> {
    fn from(task: &'a Task) -> Self {
        NamesRef {
            kind: &task.kind,
            tenant: &task.tenant,
            device: &task.device,
            labels: &task.labels,
        }
    }
}

impl<'a> From<&'a TaskSpec> for NamesRef<'a> {
    fn from(spec: &'a TaskSpec) -> Self {
        NamesRef {
            kind: &spec.kind,
            tenant: &spec.tenant,
            device: &spec.device,
            labels: &spec.labels,
        }
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

impl NamesRef<'static> {
    /// Names all empty: for a decision about a task the caller knows only by its view (tools,
    /// benchmarks, tests).
    pub fn unnamed() -> Self {
        NamesRef {
            kind: "",
            tenant: "",
            device: "",
            labels: &NO_LABELS,
        }
    }
}
