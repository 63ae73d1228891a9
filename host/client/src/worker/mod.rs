//! The worker client a GPU service can embed: it heartbeats, claims what its capacity allows,
//! runs each lease through an `Executor` while keeping the lease alive, and reports the
//! outcome with the lease's token. `synthetic` is the executor of `sluice worker`.

mod lease;
pub mod synthetic;

use crate::{Client, ClientError};
use sluice_model::{FailureClass, Heartbeat, LoadedModel};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;

pub use sluice_wire::LeaseGrant;

/// What an attempt came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Complete(serde_json::Value),
    Fail {
        class: FailureClass,
        message: String,
    },
}

/// Runs one leased task. The worker keeps the lease alive while the future runs. When the
/// server ends the task meanwhile (a cancel, its deadline), `cancel` fires: the executor should
/// stop its work and return soon (what it returns is then not reported). The server keeps the
/// attempt's GPU counted as busy until it does, or until the lease runs out.
///
/// A worker that claims GPU batches (`WorkerConfig::batch`) hands each batch to
/// `execute_batch` as one call: tasks of one kind, model and batch key, on one GPU. Its
/// default runs `execute` for each task at once; a GPU service overrides it to run the inputs
/// as one batch. Each task keeps its own lease, cancel signal and report.
pub trait Executor: Send + Sync + 'static {
    fn execute(&self, grant: &LeaseGrant, cancel: Cancel) -> impl Future<Output = Outcome> + Send;

    /// Runs a batch; one outcome per grant, in order (a missing one fails its task).
    fn execute_batch(
        &self,
        grants: &[LeaseGrant],
        cancels: &[Cancel],
    ) -> impl Future<Output = Vec<Outcome>> + Send {
        futures_util::future::join_all(
            grants
                .iter()
                .zip(cancels)
                .map(|(grant, cancel)| self.execute(grant, cancel.clone())),
        )
    }
}

/// The signal that the server has ended the task an attempt runs for.
#[derive(Clone, Debug)]
pub struct Cancel(tokio::sync::watch::Receiver<bool>);

impl Cancel {
    /// A signal and the sender that fires it.
    pub fn new() -> (tokio::sync::watch::Sender<bool>, Cancel) {
        let (sender, receiver) = tokio::sync::watch::channel(false);
        (sender, Cancel(receiver))
    }

    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the signal fires; never, if its sender goes without firing it.
    pub async fn cancelled(&mut self) {
        if self.0.wait_for(|cancelled| *cancelled).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The models a worker holds loaded in GPU memory, as its executor loads and unloads them: a
/// change is sent in a heartbeat at once, so tasks for a model find the worker that has it.
/// Clones share one list.
#[derive(Clone, Debug)]
pub struct LoadedModels(Arc<tokio::sync::watch::Sender<Vec<LoadedModel>>>);

impl LoadedModels {
    pub fn new(models: Vec<LoadedModel>) -> Self {
        LoadedModels(Arc::new(tokio::sync::watch::Sender::new(models)))
    }

    pub fn get(&self) -> Vec<LoadedModel> {
        self.0.borrow().clone()
    }

    /// Adds `model` (or moves it to another GPU); at most `MAX_LOADED_MODELS`, the oldest
    /// going first.
    pub fn loaded(&self, model: LoadedModel) {
        self.0.send_if_modified(|models| {
            if models.contains(&model) {
                return false;
            }
            models.retain(|held| held.name != model.name);
            if models.len() >= sluice_model::MAX_LOADED_MODELS {
                models.remove(0);
            }
            models.push(model);
            true
        });
    }

    /// Removes the model named `name`.
    pub fn unloaded(&self, name: &str) {
        self.0.send_if_modified(|models| {
            let before = models.len();
            models.retain(|held| held.name != name);
            models.len() != before
        });
    }
}

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    pub id: String,
    /// What each heartbeat says, but for `loaded_models`, which come from `loaded_models`.
    pub heartbeat: Heartbeat,
    pub loaded_models: LoadedModels,
    /// How long one claim waits for work on the server.
    pub claim_wait_ms: u64,
    pub heartbeat_interval: Duration,
    /// Claim GPU batches of this shape (each run by `Executor::execute_batch`) rather than
    /// single tasks. A batch is claimed once `max_size` of the worker's places are free: set
    /// `max_concurrency` to the GPUs times `max_size`.
    pub batch: Option<sluice_wire::BatchRequest>,
}

impl WorkerConfig {
    pub fn new(id: impl Into<String>, heartbeat: Heartbeat) -> Self {
        WorkerConfig {
            id: id.into(),
            loaded_models: LoadedModels::new(heartbeat.loaded_models.clone()),
            heartbeat,
            claim_wait_ms: 5_000,
            heartbeat_interval: Duration::from_secs(2),
            batch: None,
        }
    }
}

/// Counts of what a worker did, for its caller and its exit line.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub claimed: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    /// Reports the server refused as stale: the lease had passed to another attempt.
    pub refused: AtomicU64,
    /// Attempts stopped because the server ended their task (cancelled, past its deadline).
    pub cancelled: AtomicU64,
    pub errors: AtomicU64,
    /// GPU batches claimed (with `WorkerConfig::batch`).
    pub batches: AtomicU64,
}

impl WorkerStats {
    pub fn line(&self) -> String {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let batches = match get(&self.batches) {
            0 => String::new(),
            1 => " in 1 batch".to_owned(),
            n => format!(" in {n} batches"),
        };
        format!(
            "claimed {}{batches} completed {} failed {} refused {} cancelled {} errors {}",
            get(&self.claimed),
            get(&self.completed),
            get(&self.failed),
            get(&self.refused),
            get(&self.cancelled),
            get(&self.errors)
        )
    }
}

/// A pause after a claim that got nothing for a reason (breaker open, stale heartbeat),
/// so a refused worker does not spin.
const REFUSED_PAUSE: Duration = Duration::from_millis(500);
/// The pause after `at-capacity`: not a refusal but a race (the server still counts a lease
/// whose report was in flight, or one an earlier run of this worker left), so it is short.
const AT_CAPACITY_PAUSE: Duration = Duration::from_millis(20);

/// Works until `shutdown` resolves, then stops claiming, lets the attempts in hand finish and
/// report, and returns what it did.
pub async fn run<E: Executor>(
    client: Client,
    config: WorkerConfig,
    executor: Arc<E>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Arc<WorkerStats>, ClientError> {
    client
        .worker_heartbeat(&config.id, &config.heartbeat_now())
        .await?;
    let stats = Arc::new(WorkerStats::default());
    let beats = tokio::spawn(heartbeats(client.clone(), config.clone(), stats.clone()));
    let slots = config.heartbeat.max_concurrency.max(1) as usize;
    let capacity = Arc::new(Semaphore::new(slots));
    tokio::pin!(shutdown);
    // A claim that got no answer is sent again under the same name, so the leases it may have
    // granted come back instead of waiting out their timeout.
    let mut unanswered_claim: Option<String> = None;
    loop {
        // A batch waits for a whole batch's places; single tasks for one.
        let wanted = config
            .batch
            .as_ref()
            .map_or(1, |batch| batch.max_size.clamp(1, slots)) as u32;
        let free = tokio::select! {
            _ = &mut shutdown => break,
            permit = capacity.clone().acquire_many_owned(wanted) => match permit {
                Ok(permit) => {
                    drop(permit);
                    capacity.available_permits().max(1)
                }
                Err(_) => break,
            },
        };
        let max = match &config.batch {
            Some(batch) => batch.max_size.min(free),
            None => free,
        };
        let claim_id = unanswered_claim
            .take()
            .unwrap_or_else(|| ulid::Ulid::new().to_string());
        let batch = config
            .batch
            .as_ref()
            .map(|batch| sluice_wire::BatchRequest {
                max_size: max.min(batch.max_size),
                ..batch.clone()
            });
        let claimed = tokio::select! {
            _ = &mut shutdown => break,
            claimed = client.claim_batch(
                &config.id,
                max.min(sluice_wire::MAX_CLAIM),
                config.claim_wait_ms,
                Some(claim_id.as_str()),
                batch.as_ref(),
            ) => claimed,
        };
        let answer = match claimed {
            Ok(answer) => answer,
            Err(error) => {
                if error.may_have_landed() {
                    unanswered_claim = Some(claim_id);
                }
                stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "claim failed");
                tokio::time::sleep(REFUSED_PAUSE).await;
                continue;
            }
        };
        if let Some(reason) = &answer.reason {
            tracing::debug!(code = %reason.code, detail = %reason.detail, "claim refused");
            if reason.code == "unknown-worker" || reason.code == "stale-heartbeat" {
                let _ = client
                    .worker_heartbeat(&config.id, &config.heartbeat_now())
                    .await;
            }
            let pause = if reason.code == "at-capacity" {
                AT_CAPACITY_PAUSE
            } else {
                REFUSED_PAUSE
            };
            tokio::time::sleep(pause).await;
            continue;
        }
        let attempt = lease::Attempt {
            client: client.clone(),
            executor: executor.clone(),
            stats: stats.clone(),
        };
        if config.batch.is_some() && !answer.leases.is_empty() {
            let count = answer.leases.len();
            stats.claimed.fetch_add(count as u64, Ordering::Relaxed);
            stats.batches.fetch_add(1, Ordering::Relaxed);
            let Ok(permits) = capacity.clone().acquire_many_owned(count as u32).await else {
                break;
            };
            tokio::spawn(async move {
                attempt.run_batch(answer.leases).await;
                drop(permits);
            });
            continue;
        }
        for grant in answer.leases {
            stats.claimed.fetch_add(1, Ordering::Relaxed);
            let Ok(permit) = capacity.clone().acquire_owned().await else {
                break;
            };
            let attempt = attempt.clone();
            tokio::spawn(async move {
                attempt.run(grant).await;
                drop(permit);
            });
        }
    }
    // Every permit back means every attempt has reported.
    let _all = capacity.acquire_many(slots as u32).await;
    beats.abort();
    Ok(stats)
}

impl WorkerConfig {
    /// The heartbeat to send now: the configured one with the models loaded now.
    pub fn heartbeat_now(&self) -> Heartbeat {
        Heartbeat {
            loaded_models: self.loaded_models.get(),
            ..self.heartbeat.clone()
        }
    }
}

/// Heartbeats every `heartbeat_interval`, and at once when the loaded models change.
async fn heartbeats(client: Client, config: WorkerConfig, stats: Arc<WorkerStats>) {
    let mut interval = tokio::time::interval(config.heartbeat_interval);
    let mut models = config.loaded_models.0.subscribe();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            changed = models.changed() => {
                if changed.is_err() {
                    interval.tick().await;
                }
            }
        }
        if let Err(error) = client
            .worker_heartbeat(&config.id, &config.heartbeat_now())
            .await
        {
            stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%error, "heartbeat failed");
        }
    }
}
