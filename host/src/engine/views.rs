//! The packed views of tasks that the aging and retry policies read.

use crate::model::{FailureClass, Priority, Task};
use policy_packed::{Bucket, ErrorClass, Failure, View, name_code};

pub fn to_bucket(priority: Priority) -> Bucket {
    match priority {
        Priority::Urgent => Bucket::Urgent,
        Priority::Normal => Bucket::Normal,
        Priority::Low => Bucket::Low,
    }
}

pub fn from_bucket(bucket: Bucket) -> Priority {
    match bucket {
        Bucket::Urgent => Priority::Urgent,
        Bucket::Normal => Priority::Normal,
        Bucket::Low => Priority::Low,
    }
}

pub fn to_error_class(class: FailureClass) -> ErrorClass {
    match class {
        FailureClass::Transient => ErrorClass::Transient,
        FailureClass::NodeBusy => ErrorClass::NodeBusy,
        FailureClass::LeaseExpired => ErrorClass::LeaseExpired,
        FailureClass::Timeout => ErrorClass::Timeout,
        FailureClass::Permanent => ErrorClass::Permanent,
        FailureClass::InvalidInput => ErrorClass::InvalidInput,
    }
}

pub fn view(task: &Task) -> View {
    View {
        // The creation event's seq: arrival order across the whole system.
        seq: task.event_seqs.first().copied().unwrap_or(task.rank),
        tenant: name_code(&task.tenant),
        kind: name_code(&task.kind),
        bucket: to_bucket(task.bucket),
        submitted_bucket: to_bucket(task.priority),
        created_ms: task.created_at_ms,
        bucket_since_ms: task.bucket_since_ms,
        attempt: task.attempt,
        est_exec_ms: task.est_exec_ms,
    }
}

/// A failed attempt of `task`, with 64 random bits for the policy's jitter.
pub fn failure(task: &Task, class: FailureClass, random: u64) -> Failure {
    Failure {
        task: view(task),
        class: to_error_class(class),
        max_attempts: task.max_attempts,
        random,
    }
}
