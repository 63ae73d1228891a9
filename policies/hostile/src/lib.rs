//! Misbehaving retry policies, for the host's sandbox tests only. Built once per feature:
//! `spin` never returns, `memory-bomb` allocates without end, `trap` panics, `files` reads a
//! file (and so imports `wasi:filesystem`, which the host must refuse). `late-trap` and
//! `late-nonsense` pass conformance and misbehave only for a task whose `seq` is
//! `LATE_SEQ`: the first panics, the second asks for a delay past the host's bound.
//! `big-init` holds 24 MiB from `init` on, and otherwise decides well.

wit_bindgen::generate!({ world: "retry-policy", path: "../../wit" });

use exports::sluice::policy::retry::Guest;
use policy_packed::{DeadReason, Decision, FAILURE_WORDS, Failure};

/// The task `seq` the `late-*` policies misbehave on.
pub const LATE_SEQ: u64 = 424_242;

#[allow(dead_code)] // used by `export!` in the wasm32 build only
struct Component;

impl Guest for Component {
    fn init(_config: Vec<u8>) -> Result<(), String> {
        #[cfg(feature = "files")]
        {
            let _ = std::fs::read("/etc/passwd");
        }
        #[cfg(feature = "big-init")]
        {
            let held: &'static mut [u8] = Box::leak(vec![1u8; 24 << 20].into_boxed_slice());
            std::hint::black_box(held);
        }
        Ok(())
    }

    // Which arguments are used depends on the feature.
    #[allow(unused_variables)]
    fn decide(now_ms: u64, failures: Vec<u64>) -> Vec<u64> {
        let failures: Vec<Failure> =
            policy_packed::records(&failures, FAILURE_WORDS, Failure::read).unwrap_or_default();
        #[cfg(feature = "spin")]
        {
            let mut n = now_ms;
            loop {
                n = std::hint::black_box(n.wrapping_mul(31).wrapping_add(7));
            }
        }
        #[cfg(feature = "memory-bomb")]
        {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        #[cfg(feature = "trap")]
        {
            panic!("a policy that panics at {now_ms}");
        }
        #[cfg(feature = "late-trap")]
        if failures.iter().any(|f| f.task.seq == LATE_SEQ) {
            panic!("a policy that panics late");
        }
        #[allow(unreachable_code)]
        failures
            .iter()
            .map(|failure| {
                let spent = failure.task.attempt >= failure.max_attempts;
                if spent || failure.class.is_hopeless() {
                    Decision::Dead(DeadReason::Policy)
                } else if cfg!(feature = "late-nonsense") && failure.task.seq == LATE_SEQ {
                    Decision::RetryAfterMs(48 * 3_600_000)
                } else {
                    Decision::RetryAfterMs(1000 + now_ms % 1000)
                }
                .word()
            })
            .collect()
    }

    // The same misbehaviour one task at a time.
    fn decide_one(now_ms: u64, failure: policy_packed::FailureWords) -> u64 {
        let failure = Failure::from_words(failure).map(|f| {
            let mut words = Vec::new();
            f.write(&mut words);
            words
        });
        Self::decide(now_ms, failure.unwrap_or_default())
            .pop()
            .unwrap_or(u64::MAX)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Component);
