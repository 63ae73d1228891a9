//! Misbehaving retry policies, for the host's sandbox tests only. Built once per feature:
//! `spin` never returns, `memory-bomb` allocates without end, `trap` panics, `files` tries to
//! read a host file in `init` and refuses to start if it can. `leaky` imports a function of
//! its own, which the host must refuse. `late-trap` and `late-nonsense` pass conformance and
//! misbehave only for a task whose `seq` is `LATE_SEQ`: the first panics, the second asks for
//! a delay past the host's bound. `big-init` holds 24 MiB from `init` on, and otherwise
//! decides well. `wasi-probe` answers with what it sees of the virtual WASI (see
//! `probe_delay_ms`).

#[cfg(not(feature = "leaky"))]
wit_bindgen::generate!({ world: "retry-policy", path: "../../wit" });

#[cfg(feature = "leaky")]
wit_bindgen::generate!({
    inline: "
        package sluice:hostile;
        world leaky-retry {
            include sluice:policy/retry-policy@0.1.0;
            import leak: func(data: list<u8>);
        }
    ",
    path: "../../wit",
    world: "sluice:hostile/leaky-retry",
});

use exports::sluice::policy::retry::Guest;
use policy_packed::{DeadReason, Decision, FAILURE_WORDS, Failure};

/// The task `seq` the `late-*` policies misbehave on.
pub const LATE_SEQ: u64 = 424_242;

#[allow(dead_code)] // used by `export!` in the wasm32 build only
struct Component;

impl Guest for Component {
    fn init(_config: Vec<u8>) -> Result<(), String> {
        #[cfg(feature = "files")]
        if let Ok(bytes) = std::fs::read("/etc/passwd") {
            return Err(format!("read {} bytes of a host file", bytes.len()));
        }
        #[cfg(feature = "leaky")]
        leak(b"secrets");
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
        #[cfg(feature = "wasi-probe")]
        if let Some(first) = failures.first() {
            return vec![Decision::RetryAfterMs(probe_delay_ms(now_ms, first.task.seq)).word()];
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

/// What the `wasi-probe` policy answers: 1 if the wall clock is not `now_ms`, 2 if the
/// monotonic clock moves within the call, 3 if a host file can be read, 4 if there is an
/// environment; otherwise 10,000 plus 0-999 drawn from std's randomly seeded hasher, which
/// must repeat for the same `now_ms`.
#[cfg(feature = "wasi-probe")]
fn probe_delay_ms(now_ms: u64, seq: u64) -> u64 {
    use std::hash::BuildHasher;
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(u128::MAX, |d| d.as_millis());
    let started = std::time::Instant::now();
    if wall_ms != u128::from(now_ms) {
        1
    } else if std::fs::read("/etc/passwd").is_ok() || std::fs::read_dir(".").is_ok() {
        3
    } else if std::env::vars().next().is_some() {
        4
    } else if started.elapsed() != std::time::Duration::ZERO {
        2
    } else {
        10_000 + std::collections::hash_map::RandomState::new().hash_one(seq) % 1000
    }
}

#[cfg(target_arch = "wasm32")]
export!(Component);
