//! A simulated worker of a replay: its heartbeat, its slots, and the model each GPU holds.

use super::NO_MODEL;
use sluice_model::{Heartbeat, LoadedModel};

/// A simulated worker.
pub(super) struct GpuWorker {
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

impl GpuWorker {
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

    /// A crash empties every GPU: the worker comes back with nothing loaded.
    pub(super) fn unload_all(&mut self) {
        self.loaded.fill((NO_MODEL, 0));
        self.heartbeat.loaded_models.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_loads_a_model_once_says_so_and_forgets_it_in_a_crash() {
        let names = ["seg-a".to_owned(), "seg-b".to_owned()];
        let mut worker = GpuWorker {
            name: "sim-0".into(),
            heartbeat: Heartbeat::default(),
            slots: 2,
            busy: 0,
            up: true,
            epoch: 0,
            loaded: vec![(NO_MODEL, 0); 2],
        };
        assert!(worker.load(1, 0, &names, 8_000));
        assert!(!worker.load(1, 0, &names, 8_000), "already there");
        assert!(!worker.load(2, 0, &names, 8_000), "no such GPU");
        assert!(worker.load(0, 1, &names, 4_000));
        let said: Vec<_> = worker
            .heartbeat
            .loaded_models
            .iter()
            .map(|m| (m.name.as_str(), m.gpu, m.memory_mb))
            .collect();
        assert_eq!(said, [("seg-b", 0, 4_000), ("seg-a", 1, 8_000)]);
        worker.unload_all();
        assert!(worker.heartbeat.loaded_models.is_empty());
        assert!(
            worker.load(1, 0, &names, 8_000),
            "loaded again after the crash"
        );
    }
}
