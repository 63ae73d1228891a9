//! The task model: identifiers, priorities, the state machine table, task records, events and submissions.

mod event;
mod id;
mod priority;
mod spec;
mod state;
mod task;

pub use event::{Actor, Event};
pub use id::{IdError, IdGenerator, TaskId};
pub use priority::Priority;
pub use spec::{Limits, Resources, Submission, TaskSpec, ValidationError};
pub use state::{IllegalTransition, State};
pub use task::{Task, TaskError};
