//! One attempt on a worker: start, run the executor while heartbeating the lease, report the
//! outcome. Reports are retried on transport errors and on 5xx answers (a full disk, a restart)
//! while the lease lasts (the server answers a repeated report as it did the first); a refusal
//! (409 stale lease) ends the attempt quietly. When the server answers `attempt-cancelled`
//! (the task was cancelled, or passed its deadline) or `attempt-revoked` (an urgent task
//! preempted it), the executor is told, and once it has returned the worker reports `stopped`,
//! which frees the attempt's GPU on the server.

use super::{Cancel, Executor, LeaseGrant, Outcome, WorkerStats};
use crate::{Client, ClientError};
use serde_json::{Map, Value};
use sluice_model::TaskId;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A report is tried at least this often, and then again while the lease lasts.
const REPORT_TRIES: u32 = 5;
const MAX_REPORT_PAUSE: Duration = Duration::from_secs(2);
const CANCELLED: &str = "urn:sluice:problem:attempt-cancelled";
const REVOKED: &str = "urn:sluice:problem:attempt-revoked";

/// The server's word that this attempt must stop: its task ended, or it was preempted.
fn told_to_stop(kind: &str) -> bool {
    kind == CANCELLED || kind == REVOKED
}

pub(super) struct Attempt<E> {
    pub client: Client,
    pub executor: Arc<E>,
    pub stats: Arc<WorkerStats>,
}

impl<E> Clone for Attempt<E> {
    fn clone(&self) -> Self {
        Attempt {
            client: self.client.clone(),
            executor: self.executor.clone(),
            stats: self.stats.clone(),
        }
    }
}

/// One task of an attempt under way: its lease, and the keeper heartbeating it.
struct Running {
    grant: LeaseGrant,
    lease_ends_ms: Arc<AtomicU64>,
    cancel: Cancel,
    keeper: tokio::task::JoinHandle<()>,
}

/// What became of a report.
enum Reported {
    Done,
    Refused,
    /// The task ended on the server while the attempt ran: stop it.
    Cancelled,
    Failed,
}

impl<E: Executor> Attempt<E> {
    pub async fn run(self, grant: LeaseGrant) {
        let Some(running) = self.start(grant).await else {
            return;
        };
        let outcome = self
            .executor
            .execute(&running.grant, running.cancel.clone())
            .await;
        self.finish(running, outcome).await;
    }

    /// Runs a GPU batch: every task started (each its own report), the started ones through
    /// one `execute_batch` call while their leases are kept, then each outcome reported.
    pub async fn run_batch(self, grants: Vec<LeaseGrant>) {
        let started =
            futures_util::future::join_all(grants.into_iter().map(|grant| self.start(grant))).await;
        let running: Vec<Running> = started.into_iter().flatten().collect();
        if running.is_empty() {
            return;
        }
        let (grants, cancels): (Vec<LeaseGrant>, Vec<Cancel>) = running
            .iter()
            .map(|r| (r.grant.clone(), r.cancel.clone()))
            .unzip();
        let mut outcomes = self
            .executor
            .execute_batch(&grants, &cancels)
            .await
            .into_iter();
        futures_util::future::join_all(running.into_iter().map(|running| {
            let outcome = outcomes.next().unwrap_or_else(|| Outcome::Fail {
                class: sluice_model::FailureClass::Transient,
                message: "the executor's batch gave no outcome for this task".into(),
            });
            self.finish(running, outcome)
        }))
        .await;
    }

    /// Reports the attempt started and sets its lease keeper going; none when the server
    /// refused the start (or the task ended, which is then reported stopped).
    async fn start(&self, grant: LeaseGrant) -> Option<Running> {
        let id = grant.task.id;
        let token = grant.lease_token.clone();
        let lease_ends_ms = Arc::new(AtomicU64::new(grant.lease_expires_at_ms));
        match self
            .report(id, &token, "start", Map::new(), &lease_ends_ms)
            .await
        {
            Reported::Done => {}
            Reported::Cancelled => {
                self.stopped(id, &token, &lease_ends_ms).await;
                return None;
            }
            Reported::Refused | Reported::Failed => return None,
        }
        let (cancel_sender, cancel) = Cancel::new();
        let keeper = tokio::spawn(keep_alive(
            self.client.clone(),
            id,
            token,
            lease_ends_ms.clone(),
            cancel_sender,
        ));
        Some(Running {
            grant,
            lease_ends_ms,
            cancel,
            keeper,
        })
    }

    /// Stops the lease keeper and reports `outcome` (or `stopped`, when the server ended the
    /// task while it ran).
    async fn finish(&self, running: Running, outcome: Outcome) {
        let Running {
            grant,
            lease_ends_ms,
            cancel,
            keeper,
        } = running;
        keeper.abort();
        let id = grant.task.id;
        let token = grant.lease_token;
        if cancel.is_cancelled() {
            return self.stopped(id, &token, &lease_ends_ms).await;
        }
        let (report, body, counter) = match outcome {
            Outcome::Complete(result) => {
                let mut body = Map::new();
                body.insert("result".into(), result);
                ("complete", body, &self.stats.completed)
            }
            Outcome::Fail { class, message } => {
                let mut body = Map::new();
                body.insert("class".into(), Value::String(class.as_str().into()));
                body.insert("message".into(), Value::String(message));
                ("fail", body, &self.stats.failed)
            }
        };
        match self.report(id, &token, report, body, &lease_ends_ms).await {
            Reported::Done => {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            // Cancelled as it ended: the server has freed its place on hearing the outcome.
            Reported::Cancelled => {
                self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            Reported::Refused | Reported::Failed => {}
        }
    }

    /// Tells the server the attempt has stopped after `attempt-cancelled` or `attempt-revoked`.
    async fn stopped(&self, id: TaskId, token: &str, lease_ends_ms: &AtomicU64) {
        self.stats.cancelled.fetch_add(1, Ordering::Relaxed);
        tracing::info!(task_id = %id, "stopped the attempt: its task ended, or it was preempted");
        self.report(id, token, "stopped", Map::new(), lease_ends_ms)
            .await;
    }

    async fn report(
        &self,
        id: TaskId,
        token: &str,
        report: &str,
        body: Map<String, Value>,
        lease_ends_ms: &AtomicU64,
    ) -> Reported {
        let mut pause = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            tries += 1;
            let error = match self.client.report(id, token, report, body.clone()).await {
                Ok(_) => return Reported::Done,
                Err(ClientError::Problem {
                    status: 409, kind, ..
                }) if told_to_stop(&kind) => {
                    return Reported::Cancelled;
                }
                Err(ClientError::Problem {
                    status: 409,
                    detail,
                    ..
                }) => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(task_id = %id, report, %detail, "report refused");
                    return Reported::Refused;
                }
                Err(ClientError::Problem { status, detail, .. })
                    if status < 500 && status != 429 =>
                {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(task_id = %id, report, status, %detail, "report rejected");
                    return Reported::Failed;
                }
                Err(error) => error,
            };
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            let lease_left = lease_left(lease_ends_ms.load(Ordering::Relaxed));
            if tries >= REPORT_TRIES && lease_left.is_zero() {
                tracing::warn!(task_id = %id, report, %error, "report failed; the lease is over, giving up");
                return Reported::Failed;
            }
            tracing::warn!(task_id = %id, report, %error, "report failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_REPORT_PAUSE);
        }
    }
}

/// Time left on a lease, by this machine's clock.
fn lease_left(expires_at_ms: u64) -> Duration {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Duration::from_millis(expires_at_ms.saturating_sub(now_ms))
}

/// Heartbeats the lease three times per lease length until aborted, keeping `lease_ends_ms`
/// up to date; fires `cancel` (and stops) when the server says the task has ended.
async fn keep_alive(
    client: Client,
    id: TaskId,
    token: String,
    lease_ends_ms: Arc<AtomicU64>,
    cancel: tokio::sync::watch::Sender<bool>,
) {
    let lease = lease_left(lease_ends_ms.load(Ordering::Relaxed));
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        match client.report(id, &token, "heartbeat", Map::new()).await {
            Ok(task) => {
                if let Some(lease) = &task.lease {
                    lease_ends_ms.store(lease.expires_at_ms, Ordering::Relaxed);
                }
            }
            Err(ClientError::Problem {
                status: 409, kind, ..
            }) if told_to_stop(&kind) => {
                tracing::info!(task_id = %id, %kind, "told to stop the attempt: stopping it");
                let _ = cancel.send(true);
                return;
            }
            Err(error) => tracing::warn!(task_id = %id, %error, "lease heartbeat failed"),
        }
    }
}
