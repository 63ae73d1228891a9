//! The synthetic executor of `sluice worker`: it takes `exec_ms` per task (or the `exec_ms` a
//! task's payload names) and fails a share of them with a chosen class, for tests and demos.

use super::{Cancel, Executor, LeaseGrant, Outcome};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_model::FailureClass;
use std::sync::Mutex;
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
    random: Mutex<SmallRng>,
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
            random: Mutex::new(SmallRng::seed_from_u64(seed)),
        }
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
        if let (Some(models), Some(model)) = (&self.learns_models, &grant.task.resources.model) {
            models.loaded(sluice_model::LoadedModel {
                name: model.clone(),
                gpu: grant.task.lease.as_ref().and_then(|l| l.gpu).unwrap_or(0),
                memory_mb: grant.task.resources.gpu_memory_mb,
            });
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(self.exec_ms(grant))) => {}
            _ = cancel.cancelled() => {
                return Outcome::Fail {
                    class: FailureClass::Transient,
                    message: "stopped: the task was cancelled".into(),
                };
            }
        }
        if self.fails() {
            return Outcome::Fail {
                class: self.fail_class,
                message: format!("synthetic {} failure on {}", self.fail_class, self.worker),
            };
        }
        Outcome::Complete(serde_json::json!({
            "worker": self.worker,
            "attempt": grant.attempt,
        }))
    }
}
