//! A simulated worker of a replay: its heartbeat, its slots, and the model each GPU holds.

use super::NO_MODEL;
use crate::model::{Heartbeat, LoadedModel};

/// A simulated worker.
pub(super) struct SimWorker {
    pub(super) name: String,
    pub(super) heartbeat: Heartbeat,
    pub(super) slots: usize,
    pub(super) busy: usize,
    pub(super) up: bool,
    /// Bumped by each crash: the attempts of an earlier epoch were abandoned.
    pub(super) epoch: u32,
    /// The model each GPU holds (a name code, and the memory it takes), as its heartbeat's
    /// `loaded_models` says.
    pub(super) loaded: Vec<(u32, u64)>,
}

impl SimWorker {
    /// Puts `model` on `gpu`; whether it had to be loaded. The heartbeat says so from now on.
    pub(super) fn load(
        &mut self,
        gpu: usize,
        model: u32,
        names: &[String],
        memory_mb: u64,
    ) -> bool {
        match self.loaded.get_mut(gpu) {
            Some(held) if held.0 != model => *held = (model, memory_mb),
            _ => return false,
        }
        self.heartbeat.loaded_models = self
            .loaded
            .iter()
            .enumerate()
            .filter(|(_, (model, _))| *model != NO_MODEL)
            .map(|(gpu, &(model, memory_mb))| LoadedModel {
                name: names[model as usize].clone(),
                gpu: gpu as u32,
                memory_mb,
            })
            .collect();
        true
    }
}
