//! Workers as they describe themselves in heartbeats, with the bounds a heartbeat must keep.

use super::spec::{ValidationError, check_name, field};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const MAX_GPUS: usize = 64;
pub const MAX_WORKER_LABELS: usize = 64;
pub const MAX_CONCURRENCY: u32 = 1024;
pub const MAX_WORKER_KINDS: usize = 64;
pub const MAX_LOADED_MODELS: usize = 256;

/// A model a worker holds in one GPU's memory, ready to run: tasks that name it go there
/// first (warm placement).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LoadedModel {
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub name: String,
    /// The GPU it is loaded on, by index in `gpus`.
    pub gpu: u32,
    /// The GPU memory it occupies.
    #[serde(default)]
    pub memory_mb: u64,
}

/// One GPU of a worker. `free` says whether Sluice may use it (false while something outside
/// Sluice holds it); Sluice itself tracks which GPUs its own leases occupy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    #[serde(default)]
    pub model: String,
    pub memory_mb: u64,
    #[serde(default = "yes")]
    pub free: bool,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// The body of `POST /v1/workers/{id}/heartbeat`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The task kinds it runs; empty for any kind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
    #[serde(default = "one")]
    pub max_concurrency: u32,
    /// Work the worker holds locally, as it reports it (shown, not used for decisions).
    #[serde(default)]
    pub queue_depth: u32,
    /// The models in its GPUs' memory now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded_models: Vec<LoadedModel>,
    /// The vector shard it holds, for a shard worker: the collection's layout is known from
    /// these, and a worker that disagrees with it is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vectors: Option<super::ShardAnnouncement>,
}

impl Heartbeat {
    /// The GPU `model` is loaded on, if it is (the first, when on several).
    pub fn gpu_with(&self, model: &str) -> Option<u32> {
        self.loaded_models
            .iter()
            .find(|loaded| loaded.name == model)
            .map(|loaded| loaded.gpu)
    }
}

impl Default for Heartbeat {
    fn default() -> Self {
        Heartbeat {
            gpus: Vec::new(),
            labels: BTreeMap::new(),
            kinds: Vec::new(),
            max_concurrency: 1,
            queue_depth: 0,
            loaded_models: Vec::new(),
            vectors: None,
        }
    }
}

impl Heartbeat {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(vectors) = &self.vectors {
            vectors.validate()?;
        }
        if self.gpus.len() > MAX_GPUS {
            return Err(field("gpus", format!("at most {MAX_GPUS} GPUs")));
        }
        if self.gpus.iter().any(|gpu| gpu.model.len() > 128) {
            return Err(field("gpus", "a GPU model is at most 128 bytes"));
        }
        if self.labels.len() > MAX_WORKER_LABELS {
            return Err(field(
                "labels",
                format!("at most {MAX_WORKER_LABELS} labels"),
            ));
        }
        for (name, value) in &self.labels {
            if name.is_empty() || name.len() > 64 || value.len() > 256 {
                return Err(field(
                    "labels",
                    "names are 1 to 64 bytes, values at most 256",
                ));
            }
        }
        if self.kinds.len() > MAX_WORKER_KINDS {
            return Err(field("kinds", format!("at most {MAX_WORKER_KINDS} kinds")));
        }
        for kind in &self.kinds {
            check_name("kinds", kind)?;
        }
        if self.loaded_models.len() > MAX_LOADED_MODELS {
            return Err(field(
                "loaded_models",
                format!("at most {MAX_LOADED_MODELS} models"),
            ));
        }
        for loaded in &self.loaded_models {
            check_name("loaded_models", &loaded.name)?;
            let Some(gpu) = self.gpus.get(loaded.gpu as usize) else {
                return Err(field(
                    "loaded_models",
                    format!(
                        "model {} names GPU {}, which is not in gpus",
                        loaded.name, loaded.gpu
                    ),
                ));
            };
            if loaded.memory_mb > gpu.memory_mb {
                return Err(field(
                    "loaded_models",
                    format!("model {} takes more memory than its GPU has", loaded.name),
                ));
            }
        }
        if self.max_concurrency == 0 || self.max_concurrency > MAX_CONCURRENCY {
            return Err(field(
                "max_concurrency",
                format!("must be 1 to {MAX_CONCURRENCY}"),
            ));
        }
        Ok(())
    }
}

/// Checks a worker id from the path: the same alphabet and length as task names.
pub fn check_worker_id(id: &str) -> Result<(), ValidationError> {
    check_name("worker id", id)
}

/// One entry of the worker log: a change of a worker's circuit breaker, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkerEvent {
    pub seq: u64,
    pub worker: String,
    pub at_ms: u64,
    pub from: String,
    pub to: String,
    pub reason: String,
    pub actor: super::Actor,
}
