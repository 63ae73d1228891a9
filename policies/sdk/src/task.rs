//! What a priority, aging or retry policy reads of a task: its packed view's fields and its
//! names (kind, tenant, device, labels), and of a failed attempt, the task and the failure.

use alloc::string::String;
use alloc::vec::Vec;
use policy_packed::{Bucket, ErrorClass, View};

/// A task's names as the host sends them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub kind: String,
    pub tenant: String,
    pub device: String,
    /// Sorted by name, each name once (at most 64).
    pub labels: Vec<(String, String)>,
}

/// Names all empty: what a policy exported with `names = false` sees.
pub static NO_NAMES: Names = Names {
    kind: String::new(),
    tenant: String::new(),
    device: String::new(),
    labels: Vec::new(),
};

/// A task as a policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task<'a> {
    /// Arrival order: grows with each task.
    pub seq: u64,
    /// The bucket it waits in now, and the one it was submitted to.
    pub bucket: Bucket,
    pub submitted_bucket: Bucket,
    pub created_ms: u64,
    /// When it entered its current bucket.
    pub bucket_since_ms: u64,
    /// Attempts started so far (0 at admission).
    pub attempt: u32,
    /// The submitter's estimate of one attempt.
    pub est_exec_ms: u64,
    /// As submitted, e.g. `oct.qa`.
    pub kind: &'a str,
    /// The site or customer it belongs to.
    pub tenant: &'a str,
    /// The device that submitted it.
    pub device: &'a str,
    /// Its labels, sorted by name: see [`Task::label`].
    pub labels: &'a [(String, String)],
    /// The 32-bit FNV-1a codes of the kind and tenant, as the packed view carries them.
    pub kind_code: u32,
    pub tenant_code: u32,
}

impl<'a> Task<'a> {
    // Built once per task in every batch: returned by value without inlining, the struct is
    // copied with `memory.copy`, a call into the host's memmove under wasmtime (+9 ns a task
    // in retry batches; see docs/benchmarks.md).
    #[inline(always)]
    pub fn new(view: View, names: &'a Names) -> Self {
        Task {
            seq: view.seq,
            bucket: view.bucket,
            submitted_bucket: view.submitted_bucket,
            created_ms: view.created_ms,
            bucket_since_ms: view.bucket_since_ms,
            attempt: view.attempt,
            est_exec_ms: view.est_exec_ms,
            kind: &names.kind,
            tenant: &names.tenant,
            device: &names.device,
            labels: &names.labels,
            kind_code: view.kind,
            tenant_code: view.tenant,
        }
    }

    /// The packed view it was read from (kind and tenant as their codes).
    pub fn view(&self) -> View {
        View {
            seq: self.seq,
            tenant: self.tenant_code,
            kind: self.kind_code,
            bucket: self.bucket,
            submitted_bucket: self.submitted_bucket,
            created_ms: self.created_ms,
            bucket_since_ms: self.bucket_since_ms,
            attempt: self.attempt,
            est_exec_ms: self.est_exec_ms,
        }
    }

    /// The value of label `name`, if the task has it.
    pub fn label(&self, name: &str) -> Option<&'a str> {
        let labels: &'a [(String, String)] = self.labels;
        labels
            .binary_search_by(|(key, _)| key.as_str().cmp(name))
            .ok()
            .map(|at| labels[at].1.as_str())
    }
}

/// A failed attempt as a retry policy sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure<'a> {
    pub task: Task<'a>,
    pub class: ErrorClass,
    /// The task's own bound on attempts.
    pub max_attempts: u32,
    /// Random bits for jitter, from the host (so a run can be replayed).
    pub random: u64,
}

impl<'a> Failure<'a> {
    // As `Task::new`: built in place, not copied.
    #[inline(always)]
    pub fn new(failure: policy_packed::Failure, names: &'a Names) -> Self {
        Failure {
            task: Task::new(failure.task, names),
            class: failure.class,
            max_attempts: failure.max_attempts,
            random: failure.random,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::borrow::ToOwned;
    use alloc::vec;

    #[test]
    fn a_task_reads_its_names_and_labels() {
        let names = Names {
            kind: "oct.qa".to_owned(),
            tenant: "site-a".to_owned(),
            device: "scanner-7".to_owned(),
            labels: vec![
                ("ed".to_owned(), "true".to_owned()),
                ("model".to_owned(), "seg-v3".to_owned()),
            ],
        };
        let task = Task::new(View::in_bucket(4, Bucket::Low), &names);
        assert_eq!(
            (task.kind, task.tenant, task.device),
            ("oct.qa", "site-a", "scanner-7")
        );
        assert_eq!(task.label("ed"), Some("true"));
        assert_eq!(task.label("model"), Some("seg-v3"));
        assert_eq!(task.label("site"), None);
        assert_eq!(task.seq, 4);
        assert_eq!(task.bucket, Bucket::Low);
    }
}
