//! One attempt on a worker: start, run the executor while heartbeating the lease, report the
//! outcome. Reports are retried on transport errors (the server answers a repeated report as
//! it did the first); a refusal (409 stale lease) ends the attempt quietly.

use super::{Executor, LeaseGrant, Outcome, WorkerStats};
use crate::client::{Client, ClientError};
use crate::model::TaskId;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const REPORT_TRIES: u32 = 5;

pub(super) struct Attempt<E> {
    pub client: Client,
    pub executor: Arc<E>,
    pub stats: Arc<WorkerStats>,
}

/// What became of a report.
enum Reported {
    Done,
    Refused,
    Failed,
}

impl<E: Executor> Attempt<E> {
    pub async fn run(self, grant: LeaseGrant) {
        let id = grant.task.id;
        let token = grant.lease_token.clone();
        match self.report(id, &token, "start", Map::new()).await {
            Reported::Done => {}
            Reported::Refused | Reported::Failed => return,
        }
        let keeper = tokio::spawn(keep_alive(
            self.client.clone(),
            id,
            token.clone(),
            lease_left(grant.lease_expires_at_ms),
        ));
        let outcome = self.executor.execute(&grant).await;
        keeper.abort();
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
        if let Reported::Done = self.report(id, &token, report, body).await {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn report(
        &self,
        id: TaskId,
        token: &str,
        report: &str,
        body: Map<String, Value>,
    ) -> Reported {
        let mut pause = Duration::from_millis(100);
        for _ in 0..REPORT_TRIES {
            match self.client.report(id, token, report, body.clone()).await {
                Ok(_) => return Reported::Done,
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
                Err(error) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(task_id = %id, report, %error, "report failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        Reported::Failed
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

/// Heartbeats the lease three times per lease length until aborted.
async fn keep_alive(client: Client, id: TaskId, token: String, lease: Duration) {
    let every = (lease / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        if let Err(error) = client.report(id, &token, "heartbeat", Map::new()).await {
            tracing::warn!(task_id = %id, %error, "lease heartbeat failed");
        }
    }
}
