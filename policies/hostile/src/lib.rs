//! Misbehaving retry policies, for the host's sandbox tests only. Built once per feature:
//! `spin` never returns, `memory-bomb` allocates without end, `trap` panics, `files` reads a
//! file (and so imports `wasi:filesystem`, which the host must refuse).

wit_bindgen::generate!({ world: "retry-policy", path: "../../wit" });

use exports::sluice::policy::retry::{Decision, Failure, Guest};

#[allow(dead_code)] // used by `export!` in the wasm32 build only
struct Component;

impl Guest for Component {
    fn init(_config: Vec<u8>) -> Result<(), String> {
        #[cfg(feature = "files")]
        {
            let _ = std::fs::read("/etc/passwd");
        }
        Ok(())
    }

    // Which arguments are used depends on the feature.
    #[allow(unused_variables)]
    fn decide(now_ms: u64, failures: Vec<Failure>) -> Vec<Decision> {
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
        #[allow(unreachable_code)]
        failures
            .iter()
            .map(|_| Decision::RetryAfterMs(now_ms % 1000))
            .collect()
    }
}

#[cfg(target_arch = "wasm32")]
export!(Component);
