//! Who decides admissions: the writer asks an `Admitter` for a whole command's submissions at
//! once, before it plans them, and hands each answer to the engine as an input.

use crate::model::{Admission, TaskSpec};

pub trait Admitter: Send + Sync + 'static {
    /// One admission per spec, in order. `first_seq` numbers the specs in arrival order
    /// (`first_seq`, `first_seq + 1`, ...). Never fails: an implementation that cannot decide
    /// answers with `Admission::native`.
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission>;
}

/// The host's own rule, with no policy runtime: for tests and tools that run a scheduler alone.
pub struct NativeAdmitter;

impl Admitter for NativeAdmitter {
    fn admit(&self, _now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| Admission::native(spec.priority, spec.est_exec_ms, seq))
            .collect()
    }
}
