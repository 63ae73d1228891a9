//! The engine's task record. It has no serde: the API shows it as `sluice_wire::TaskView`, and
//! each store encodes it in a versioned format of its own (`sluice_store::record`).

use super::{Assignments, Priority, Resources, State, TaskId, VariantTag};
use std::collections::BTreeMap;

/// Why a task ended badly (or why its last attempt failed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskError {
    pub class: String,
    pub message: String,
}

/// A task as the engine keeps it. The payload is stored beside it, not inside it, so that state
/// changes do not rewrite up to a MiB of payload.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub id: TaskId,
    pub key: Option<String>,
    pub kind: String,
    pub priority: Priority,
    /// The bucket the task waits in now: as admitted, or higher after aging.
    pub bucket: Priority,
    /// Its order inside the bucket (lower first), as admitted.
    pub rank: u64,
    /// How long one attempt may run before it is failed as timed out, as admitted.
    pub attempt_timeout_ms: u64,
    pub device: String,
    pub tenant: String,
    pub labels: BTreeMap<String, String>,
    pub est_exec_ms: u64,
    pub deadline_ms: Option<u64>,
    /// `created_at_ms + deadline_ms`, when a deadline was given.
    pub deadline_at_ms: Option<u64>,
    pub max_attempts: u32,
    pub callback_url: Option<String>,
    pub resources: Resources,
    /// See `TaskSpec::concurrency_key`.
    pub concurrency_key: Option<String>,
    /// See `TaskSpec::preemptible`.
    pub preemptible: bool,
    /// Attempts stopped by preemption: they do not count against `max_attempts`, so the
    /// attempts spent are `attempt - preemptions`.
    pub preemptions: u32,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub attempt: u32,
    pub state: State,
    /// When it entered its current bucket (admission or its last promotion), for aging.
    pub bucket_since_ms: u64,
    /// The lease of the current attempt while Claimed or Running; after that, the last
    /// attempt's, so that a repeated report can be told from a stale one.
    pub lease: Option<Lease>,
    /// While in RetryWait: when it goes back to its queue.
    pub not_before_ms: Option<u64>,
    /// The completion callback's delivery, once the task is terminal and has a `callback_url`.
    pub callback: Option<Callback>,
    pub result: Option<serde_json::Value>,
    pub error: Option<TaskError>,
    /// The `seq` of each of its events, oldest first: the index from a task into the log.
    pub event_seqs: Vec<u64>,
    /// For a child of a split: the task it is part of.
    pub parent: Option<TaskId>,
    /// For a split parent: its children and how many have ended.
    pub family: Option<Family>,
    /// The leases of earlier attempts, newest last, at most `MAX_RETIRED_LEASES`: a report
    /// with one of their tokens comes from a genuinely stale holder (logged once per attempt);
    /// a token found neither here nor in `lease` never held the task, and writes nothing.
    pub retired_leases: Vec<RetiredLease>,
    /// The experiment variants it was assigned at admission, one per kind at most; its
    /// decisions of that kind are the variant's for as long as the experiment runs.
    pub variants: Vec<VariantTag>,
    /// When its first attempt was claimed: the end of its first wait, which experiment
    /// reports measure.
    pub first_claimed_at_ms: Option<u64>,
}

/// Earlier attempts' leases a task remembers, at most; a holder older than these is answered
/// as one whose token never held the task (409, nothing written).
pub const MAX_RETIRED_LEASES: usize = 4;

/// What a task keeps of an earlier attempt's lease: a digest of its token (never the token),
/// whose it was, and whether a refused report of it has been logged already.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetiredLease {
    pub token_sha256: String,
    pub attempt: u32,
    pub worker: String,
    pub refusal_logged: bool,
}

/// The digest a retired lease keeps of its token: the first 16 bytes of its SHA-256, in hex.
pub fn token_digest(token: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(token.as_bytes());
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// A split parent's bookkeeping: what it needs to merge without reading its payload again.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    pub parts: Vec<FamilyPart>,
    /// Children that have reached a terminal state.
    pub settled: u32,
    pub k: u32,
    pub allow_partial: bool,
    /// When it merges whatever has answered, if its children have not all ended by then.
    pub merge_at_ms: Option<u64>,
    /// The collection searched, as its layout stood at the split (none in families split
    /// before collections existed).
    pub scope: Option<SearchScope>,
}

/// What a split search was over: coverage is measured against it, not against the children.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SearchScope {
    pub collection: String,
    pub metric: crate::Metric,
    /// The collection's shards at the split.
    pub shards: u32,
}

/// One child of a split parent.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyPart {
    pub task: TaskId,
    pub weight: f32,
    /// What it covers, for messages ("shard 3").
    pub covers: String,
    /// The stored shard it searches, for a shard filter.
    pub shard: Option<u32>,
}

/// One attempt's hold on a task: only reports carrying `token` count, and only until
/// `expires_at_ms` (which heartbeats push back, never past `attempt_ends_at_ms`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub worker: String,
    pub token: String,
    pub attempt: u32,
    pub expires_at_ms: u64,
    /// Claim time plus the attempt timeout: past it the attempt fails as `timeout`.
    pub attempt_ends_at_ms: u64,
    /// When the attempt was leased (0 in records written before it was kept).
    pub claimed_at_ms: u64,
    /// When the worker reported the start, if it did: execution time runs from here.
    pub started_at_ms: Option<u64>,
    /// The worker's GPU this attempt occupies, by index in its heartbeat.
    pub gpu: Option<u32>,
    /// Whether a refused report carrying this token has been logged: one event per attempt.
    pub refusal_logged: bool,
    /// When the task ended (cancelled, or past its deadline) while this attempt held it. The
    /// worker learns it at its next report (`attempt-cancelled`), and its place (the GPU) stays
    /// counted as busy until `stopped_at_ms`: nothing is placed on a GPU still computing.
    pub ended_at_ms: Option<u64>,
    /// When the worker said the attempt had stopped after `ended_at_ms`, or the lease ran out
    /// without it saying so (then this is at or after `expires_at_ms`).
    pub stopped_at_ms: Option<u64>,
    /// The worker's name for the claim that granted this lease: the same claim sent again
    /// (its answer was lost, say with the replica that served it) is answered with the leases
    /// it granted instead of new ones.
    pub claim_id: Option<String>,
    /// When an urgent task preempted this attempt: the worker learns it at its next report
    /// (`attempt-revoked`), and the place stays held until it says `stopped` (or the lease,
    /// no longer extended, runs out); then the task waits in its queue again.
    pub revoked_at_ms: Option<u64>,
    /// The urgent task this attempt was preempted for.
    pub revoked_for: Option<super::TaskId>,
}

impl Lease {
    /// The task ended under this lease and its worker has not yet stopped the attempt.
    pub fn holds_place_after_end(&self) -> bool {
        self.ended_at_ms.is_some() && self.stopped_at_ms.is_none()
    }
}

/// Delivery of a completion callback: at least once, retried with backoff up to a bound.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callback {
    pub attempts: u32,
    /// When the next attempt is due (while one is in flight: when it is given up on).
    pub next_at_ms: u64,
    pub delivered_at_ms: Option<u64>,
    pub gave_up: bool,
}

impl Task {
    /// Attempts counted against `max_attempts`: those preemption stopped are not.
    pub fn attempts_spent(&self) -> u32 {
        debug_assert!(
            self.preemptions <= self.attempt,
            "more preemptions than attempts"
        );
        self.attempt.saturating_sub(self.preemptions)
    }

    /// Its variant of the `kind` experiment, if it was assigned one.
    pub fn variant(&self, kind: super::PolicyKind) -> Option<VariantTag> {
        self.variants.iter().find(|tag| tag.kind == kind).copied()
    }

    /// The task without its lease token, for anyone but the worker holding the lease.
    pub fn without_token(mut self) -> Task {
        if let Some(lease) = &mut self.lease {
            lease.token.clear();
        }
        self
    }

    /// Whether a callback still has to be delivered.
    pub fn callback_pending(&self) -> bool {
        self.callback
            .as_ref()
            .is_some_and(|c| c.delivered_at_ms.is_none() && !c.gave_up)
    }
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
    /// The variants of the running live experiments it is in.
    pub variants: Assignments,
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
            variants: Assignments::default(),
        }
    }
}
