//! The synthetic executor of `sluice worker`: it takes `exec_ms` per task (or the `exec_ms` a
//! task's payload names) and fails a share of them with a chosen class, for tests and demos.
//! A GPU batch of n tasks takes `exec_ms × (1 + batch_alpha × (n − 1))` on its GPU, one batch
//! at a time per GPU, as batched inference does; the GPU time spent is counted.

use super::{Cancel, Executor, LeaseGrant, Outcome};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_model::FailureClass;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest a payload may ask an attempt to take: an hour.
const MAX_EXEC_MS: u64 = 3_600_000;

pub struct Synthetic {
    pub worker: String,
    pub exec_ms: u64,
    /// The share of attempts that fail, 0 to 1.
    pub fail_rate: f64,
    pub fail_class: FailureClass,
    /// When set, an attempt of a task naming a model it lacks "loads" it on the attempt's GPU
    /// (with the task's GPU memory), as a real service would, and the next heartbeat says so.
    pub learns_models: Option<super::LoadedModels>,
    /// What each task past the first adds to a batch's time, as a share of one task's.
    pub batch_alpha: f64,
    /// GPU time spent running attempts and batches, in µs.
    pub gpu_busy_us: AtomicU64,
    random: Mutex<SmallRng>,
    /// One lock per GPU index: a GPU runs one batch at a time.
    gpus: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
}

impl Synthetic {
    pub fn new(
        worker: String,
        exec_ms: u64,
        fail_rate: f64,
        fail_class: FailureClass,
        seed: u64,
    ) -> Self {
        Synthetic {
            worker,
            exec_ms,
            fail_rate: fail_rate.clamp(0.0, 1.0),
            fail_class,
            learns_models: None,
            batch_alpha: 0.0,
            gpu_busy_us: AtomicU64::new(0),
            random: Mutex::new(SmallRng::seed_from_u64(seed)),
            gpus: Mutex::new(HashMap::new()),
        }
    }

    /// GPU time spent so far.
    pub fn gpu_busy(&self) -> Duration {
        Duration::from_micros(self.gpu_busy_us.load(Ordering::Relaxed))
    }

    /// How long a batch of `tasks` taking `exec_ms` alone takes.
    pub fn batch_ms(&self, exec_ms: u64, tasks: usize) -> u64 {
        let extra = self.batch_alpha.max(0.0) * tasks.saturating_sub(1) as f64;
        (exec_ms as f64 * (1.0 + extra)).round() as u64
    }

    fn gpu_lock(&self, gpu: u32) -> Arc<tokio::sync::Mutex<()>> {
        let mut gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        gpus.entry(gpu).or_default().clone()
    }

    fn learn_model(&self, grant: &LeaseGrant) {
        if let (Some(models), Some(model)) = (&self.learns_models, &grant.task.resources.model) {
            models.loaded(sluice_model::LoadedModel {
                name: model.clone(),
                gpu: grant.task.lease.as_ref().and_then(|l| l.gpu).unwrap_or(0),
                memory_mb: grant.task.resources.gpu_memory_mb,
            });
        }
    }

    /// The outcome of a task that ran to its end: a failure by `fail_rate`, else a result.
    fn ended(&self, grant: &LeaseGrant, batch: Option<usize>) -> Outcome {
        if self.fails() {
            return Outcome::Fail {
                class: self.fail_class,
                message: format!("synthetic {} failure on {}", self.fail_class, self.worker),
            };
        }
        let mut result = serde_json::json!({
            "worker": self.worker,
            "attempt": grant.attempt,
        });
        if let Some(batch) = batch {
            result["batch"] = batch.into();
        }
        Outcome::Complete(result)
    }

    /// The payload's `exec_ms` when it has one (a number), else the worker's.
    fn exec_ms(&self, grant: &LeaseGrant) -> u64 {
        #[derive(serde::Deserialize)]
        struct Timed {
            exec_ms: u64,
        }
        grant
            .payload
            .as_deref()
            .and_then(|raw| serde_json::from_str::<Timed>(raw.get()).ok())
            .map_or(self.exec_ms, |timed| timed.exec_ms.min(MAX_EXEC_MS))
    }

    fn fails(&self) -> bool {
        let mut random = self.random.lock().unwrap_or_else(|p| p.into_inner());
        random.random_bool(self.fail_rate)
    }
}

impl Executor for Synthetic {
    async fn execute(&self, grant: &LeaseGrant, mut cancel: Cancel) -> Outcome {
        self.learn_model(grant);
        let exec_ms = self.exec_ms(grant);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(exec_ms)) => {}
            _ = cancel.cancelled() => {
                return Outcome::Fail {
                    class: FailureClass::Transient,
                    message: "stopped: the task was cancelled".into(),
                };
            }
        }
        self.gpu_busy_us
            .fetch_add(exec_ms.saturating_mul(1_000), Ordering::Relaxed);
        self.ended(grant, None)
    }

    /// One sleep for the whole batch, on its GPU alone. A task cancelled meanwhile is stopped
    /// by the worker (its outcome here is not reported); the others run to the end.
    async fn execute_batch(&self, grants: &[LeaseGrant], _cancels: &[Cancel]) -> Vec<Outcome> {
        let Some(first) = grants.first() else {
            return Vec::new();
        };
        for grant in grants {
            self.learn_model(grant);
        }
        let exec_ms = grants.iter().map(|g| self.exec_ms(g)).max().unwrap_or(0);
        let batch_ms = self.batch_ms(exec_ms, grants.len());
        let gpu = first.task.lease.as_ref().and_then(|l| l.gpu).unwrap_or(0);
        let lock = self.gpu_lock(gpu);
        let _running = lock.lock().await;
        tokio::time::sleep(Duration::from_millis(batch_ms)).await;
        self.gpu_busy_us
            .fetch_add(batch_ms.saturating_mul(1_000), Ordering::Relaxed);
        grants
            .iter()
            .map(|grant| self.ended(grant, Some(grants.len())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_costs_one_task_and_alpha_for_each_task_past_the_first() {
        let mut synthetic = Synthetic::new("w".into(), 100, 0.0, FailureClass::Transient, 1);
        assert_eq!(synthetic.batch_ms(100, 1), 100);
        assert_eq!(synthetic.batch_ms(100, 8), 100, "alpha 0: free riders");
        synthetic.batch_alpha = 0.1;
        assert_eq!(synthetic.batch_ms(100, 8), 170);
        assert_eq!(synthetic.batch_ms(100, 0), 100);
    }
}
