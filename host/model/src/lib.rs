//! The task model: identifiers, priorities, the state machine table, task records, events and
//! submissions; workers' heartbeats; the records of policy versions; and the vector-search
//! payloads that split and merge read; tokens' records and the audit log.

mod access;
mod change;
mod collection;
mod concurrency;
mod destination;
mod event;
mod experiment;
mod failure;
mod id;
mod names;
mod policy;
mod priority;
mod queue_entry;
mod rollout;
mod spec;
mod state;
mod task;
mod vector;
mod worker;

pub use access::{AuditEvent, Role, TokenRecord};
pub use change::{Change, KeyRecord, NewTask, Recovery, TaskWrite};
pub use collection::{
    Collection, DEFAULT_COLLECTION, Layout, MAX_COLLECTION_SHARDS, MAX_COLLECTIONS,
    ShardAnnouncement, check_collection_name,
};
pub use concurrency::{
    ConcurrencyLimit, ConcurrencyLimits, MAX_CONCURRENCY_LIMIT, MAX_CONCURRENCY_LIMITS,
    check_concurrency_limit,
};
pub use destination::{CallbackAllow, is_local_name, is_public};
pub use event::{Actor, Event};
pub use experiment::{
    AssignBy, Assignments, Experiment, ExperimentEnd, ExperimentMode, ExperimentSpec,
    MAX_EXPERIMENTS, VariantSpec, VariantTag,
};
pub use failure::FailureClass;
pub use id::{IdError, IdGenerator, TaskId, TaskIdMap};
pub use names::{NamesRef, TaskNames};
pub use policy::{
    BUILTIN_VERSION, DataRef, PolicyAction, PolicyEvent, PolicyKind, PolicyVersion, UnknownKind,
};
pub use priority::Priority;
pub use queue_entry::{QueueEntry, QueueNeeds, from_bucket, to_bucket, view as task_view};
pub use rollout::{
    DEFAULT_MIN_TASKS, DEFAULT_STEP_MS, DEFAULT_STEPS, GUARD_METRICS, Guard, GuardLimit,
    GuardMetric, GuardOp, MAX_GUARDS, MAX_ROLLOUT_STEPS, Rollout, RolloutSpec, RolloutState,
    RolloutStep, RolloutStepRecord, STEP_WAIT_FACTOR, WaitFigure, rollouts,
};
pub use spec::{
    Limits, MAX_ATTEMPTS, Resources, Submission, TaskSpec, ValidationError, check_name,
};
pub use state::{IllegalTransition, State};
pub use task::{
    Admission, Callback, Family, FamilyPart, Lease, MAX_RETIRED_LEASES, RetiredLease, SearchScope,
    Task, TaskError, token_digest,
};
pub use vector::{
    Hit, MAX_DIMENSIONS as VECTOR_MAX_DIMENSIONS, MAX_K as VECTOR_MAX_K, MergedAnswer, Metric,
    ShardAnswer, ShardFilter, ShardQuery, VectorQuery, id_hash,
};
pub use worker::{Gpu, Heartbeat, LoadedModel, MAX_LOADED_MODELS, WorkerEvent, check_worker_id};

/// The target of the spans that follow a task — `submit`, `admit`, `claim`, `start`,
/// `complete`, `fail` — each with a `task_id` field. They are at debug level, so they cost
/// nothing unless `SLUICE_LOG` asks for them (`info,sluice::task=debug`).
pub const TASK_SPANS: &str = "sluice::task";
