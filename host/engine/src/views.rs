//! The packed failure records the retry policy reads.

use policy_packed::{ErrorClass, Failure};
use sluice_model::{FailureClass, Task, task_view as view};

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

/// A failed attempt of `task`, with 64 random bits for the policy's jitter.
pub fn failure(task: &Task, class: FailureClass, random: u64) -> Failure {
    Failure {
        task: view(task),
        class: to_error_class(class),
        // The policy compares the attempt number with this: attempts preemption stopped
        // are not counted.
        max_attempts: task.max_attempts.saturating_add(task.preemptions),
        random,
    }
}
