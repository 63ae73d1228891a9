//! `sluice bench policy`: what a decision costs in each default policy as a WASM component,
//! against the same crate's logic called natively, one at a time and in batches; and how long
//! compiling a component and swapping in a fresh instance take.

use anyhow::Context;
use sluice::policy::bindings::{aging, merge, priority, retry};
use sluice::policy::{
    AgingInstance, Kind, MergeInstance, PolicyRuntime, PriorityInstance, RetryInstance,
    RuntimeOptions, defaults,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct PolicyBenchArgs {
    /// Decisions measured per (policy, batch size) pair.
    #[arg(long, default_value_t = 200_000)]
    decisions: usize,
}

const BATCHES: [usize; 3] = [1, 100, 1000];

pub async fn run(args: PolicyBenchArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || measure(args.decisions.clamp(1_000, 10_000_000))).await?
}

fn measure(decisions: usize) -> anyhow::Result<()> {
    let runtime = Arc::new(PolicyRuntime::new(RuntimeOptions::default())?);
    println!("{:<18} {:>10} {:>10}", "policy", "compile_ms", "swap_ms");
    for (name, kind, bytes) in [
        (
            "priority-buckets",
            Kind::Priority,
            defaults::PRIORITY_BUCKETS,
        ),
        ("aging-threshold", Kind::Aging, defaults::AGING_THRESHOLD),
        ("retry-backoff", Kind::Retry, defaults::RETRY_BACKOFF),
        ("merge-topk", Kind::Merge, defaults::MERGE_TOPK),
    ] {
        let started = Instant::now();
        let compiled = runtime.compile(kind, bytes)?;
        let compile = started.elapsed();
        // A swap is a fresh instance of the compiled component, initialised with its config.
        let started = Instant::now();
        match kind {
            Kind::Priority => drop(PriorityInstance::new(runtime.clone(), &compiled, b"")?),
            Kind::Aging => drop(AgingInstance::new(runtime.clone(), &compiled, b"")?),
            Kind::Retry => drop(RetryInstance::new(runtime.clone(), &compiled, b"")?),
            _ => drop(MergeInstance::new(runtime.clone(), &compiled, b"")?),
        }
        let swap = started.elapsed();
        println!("{name:<18} {:>10.1} {:>10.3}", ms(compile), ms(swap));
    }

    measure_registry(&runtime)?;

    println!();
    println!(
        "{:<18} {:>6} {:>14} {:>14} {:>8}",
        "policy", "batch", "wasm_ns/dec", "native_ns/dec", "ratio"
    );
    let mut retry_bench = RetryBench::new(&runtime)?;
    let mut priority_bench = PriorityBench::new(&runtime)?;
    let mut aging_bench = AgingBench::new(&runtime)?;
    let mut merge_bench = MergeBench::new(&runtime)?;
    for batch in BATCHES {
        let rounds = (decisions / batch).max(1);
        let report = |name: &str, wasm: Duration, native: Duration| {
            let per = |d: Duration| d.as_nanos() as f64 / (rounds * batch) as f64;
            println!(
                "{name:<18} {batch:>6} {:>14.1} {:>14.1} {:>8.1}",
                per(wasm),
                per(native),
                per(wasm) / per(native).max(0.001)
            );
        };
        let (wasm, native) = retry_bench.run(batch, rounds)?;
        report("retry-backoff", wasm, native);
        let (wasm, native) = priority_bench.run(batch, rounds)?;
        report("priority-buckets", wasm, native);
        let (wasm, native) = aging_bench.run(batch, rounds)?;
        report("aging-threshold", wasm, native);
        let (wasm, native) = merge_bench.run(batch, rounds.min(20_000))?;
        report("merge-topk (hits)", wasm, native);
    }
    Ok(())
}

/// The registry's own costs on a real store (fdatasync on): storing a validated version, an
/// activation (its code from the cache), a rollback, and one decision through the active chain.
fn measure_registry(runtime: &Arc<PolicyRuntime>) -> anyhow::Result<()> {
    use sluice::policy::{PolicyRegistry, RegistryOptions};
    use sluice::store::{SledOptions, SledStore};
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let store = Arc::new(SledStore::open(dir.path(), &SledOptions::default())?);
    let registry = PolicyRegistry::open(runtime.clone(), store, RegistryOptions::default())?;
    let started = Instant::now();
    let uploaded = registry.upload(
        Kind::Retry,
        defaults::RETRY_BACKOFF,
        Some("initial_delay_ms=1000".into()),
        0,
    )?;
    let upload = started.elapsed();
    let started = Instant::now();
    registry.activate(Kind::Retry, uploaded.version.version, 0)?;
    let activate = started.elapsed();
    let failure = retry_failures(1);
    let rounds = 100_000u32;
    let started = Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(registry.retry(1, &failure)?);
    }
    let decision = started.elapsed() / rounds;
    let started = Instant::now();
    registry.rollback(Kind::Retry, 0)?;
    let rollback = started.elapsed();
    println!();
    println!(
        "registry (retry-backoff): upload {:.1} ms (validated, stored, synced; code cached), activate {:.2} ms, rollback {:.2} ms, one decision through the active chain {} ns",
        ms(upload),
        ms(activate),
        ms(rollback),
        decision.as_nanos()
    );
    Ok(())
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

fn timed(mut body: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    body()?;
    Ok(started.elapsed())
}

/// `count` transient failures of first attempts, with varied random bits.
fn retry_failures(count: usize) -> Vec<retry::exports::sluice::policy::retry::Failure> {
    use retry::exports::sluice::policy::retry::{ErrorClass, Failure};
    use retry::sluice::policy::types::{Bucket, TaskView};
    (0..count as u64)
        .map(|n| Failure {
            task: TaskView {
                seq: n,
                tenant: 0,
                kind: 0,
                bucket: Bucket::Normal,
                submitted_bucket: Bucket::Normal,
                created_ms: 0,
                bucket_since_ms: 0,
                attempt: 1,
                est_exec_ms: 1000,
            },
            class: ErrorClass::Transient,
            max_attempts: 3,
            random: n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        })
        .collect()
}

struct RetryBench {
    instance: RetryInstance,
}

impl RetryBench {
    fn new(runtime: &Arc<PolicyRuntime>) -> anyhow::Result<Self> {
        let compiled = runtime.compile(Kind::Retry, defaults::RETRY_BACKOFF)?;
        Ok(RetryBench {
            instance: RetryInstance::new(runtime.clone(), &compiled, b"")?,
        })
    }

    fn run(&mut self, batch: usize, rounds: usize) -> anyhow::Result<(Duration, Duration)> {
        let failures = retry_failures(batch);
        let instance = &mut self.instance;
        let wasm = timed(|| {
            for _ in 0..rounds {
                std::hint::black_box(instance.decide(1, &failures)?);
            }
            Ok(())
        })?;
        let settings = retry_backoff::Settings::default();
        let native_classes =
            vec![retry_backoff::exports::sluice::policy::retry::ErrorClass::Transient; batch];
        let native = timed(|| {
            for _ in 0..rounds {
                let out: Vec<_> = native_classes
                    .iter()
                    .enumerate()
                    .map(|(n, class)| {
                        settings.decide(
                            *class,
                            1,
                            3,
                            (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        )
                    })
                    .collect();
                std::hint::black_box(out);
            }
            Ok(())
        })?;
        Ok((wasm, native))
    }
}

struct PriorityBench {
    instance: PriorityInstance,
}

impl PriorityBench {
    fn new(runtime: &Arc<PolicyRuntime>) -> anyhow::Result<Self> {
        let compiled = runtime.compile(Kind::Priority, defaults::PRIORITY_BUCKETS)?;
        Ok(PriorityBench {
            instance: PriorityInstance::new(runtime.clone(), &compiled, b"")?,
        })
    }

    fn run(&mut self, batch: usize, rounds: usize) -> anyhow::Result<(Duration, Duration)> {
        use priority::sluice::policy::types::{Bucket, TaskMeta, TaskView};
        let view = |n: u64| TaskView {
            seq: n,
            tenant: 1,
            kind: 2,
            bucket: Bucket::Low,
            submitted_bucket: Bucket::Low,
            created_ms: n,
            bucket_since_ms: n,
            attempt: 0,
            est_exec_ms: 30_000,
        };
        let meta = |n: u64| TaskMeta {
            view: view(n),
            kind_name: "oct.analyze".into(),
            tenant_name: "site-a".into(),
            device: "scanner-1".into(),
            labels: Vec::new(),
        };
        let tasks: Vec<TaskMeta> = (0..batch as u64).map(meta).collect();
        let instance = &mut self.instance;
        let wasm = timed(|| {
            for _ in 0..rounds {
                std::hint::black_box(instance.admit(1, &tasks)?);
            }
            Ok(())
        })?;
        use priority_buckets::sluice::policy::types as native_types;
        let native_tasks: Vec<native_types::TaskMeta> = (0..batch as u64)
            .map(|n| native_types::TaskMeta {
                view: native_types::TaskView {
                    seq: n,
                    tenant: 1,
                    kind: 2,
                    bucket: native_types::Bucket::Low,
                    submitted_bucket: native_types::Bucket::Low,
                    created_ms: n,
                    bucket_since_ms: n,
                    attempt: 0,
                    est_exec_ms: 30_000,
                },
                kind_name: "oct.analyze".into(),
                tenant_name: "site-a".into(),
                device: "scanner-1".into(),
                labels: Vec::new(),
            })
            .collect();
        let settings = priority_buckets::Settings::default();
        let native = timed(|| {
            for _ in 0..rounds {
                let out: Vec<_> = native_tasks.iter().map(|t| settings.admit(t)).collect();
                std::hint::black_box(out);
            }
            Ok(())
        })?;
        Ok((wasm, native))
    }
}

struct AgingBench {
    instance: AgingInstance,
}

impl AgingBench {
    fn new(runtime: &Arc<PolicyRuntime>) -> anyhow::Result<Self> {
        let compiled = runtime.compile(Kind::Aging, defaults::AGING_THRESHOLD)?;
        Ok(AgingBench {
            instance: AgingInstance::new(runtime.clone(), &compiled, b"")?,
        })
    }

    fn run(&mut self, batch: usize, rounds: usize) -> anyhow::Result<(Duration, Duration)> {
        use aging::sluice::policy::types::{Bucket, TaskView};
        let waiting: Vec<TaskView> = (0..batch as u64)
            .map(|n| TaskView {
                seq: n,
                tenant: 0,
                kind: 0,
                bucket: Bucket::Low,
                submitted_bucket: Bucket::Low,
                created_ms: 0,
                bucket_since_ms: n * 40_000,
                attempt: 0,
                est_exec_ms: 0,
            })
            .collect();
        let instance = &mut self.instance;
        let wasm = timed(|| {
            for _ in 0..rounds {
                std::hint::black_box(instance.age(4_000_000, &waiting)?);
            }
            Ok(())
        })?;
        use aging_threshold::sluice::policy::types as native_types;
        let native_waiting: Vec<native_types::TaskView> = (0..batch as u64)
            .map(|n| native_types::TaskView {
                seq: n,
                tenant: 0,
                kind: 0,
                bucket: native_types::Bucket::Low,
                submitted_bucket: native_types::Bucket::Low,
                created_ms: 0,
                bucket_since_ms: n * 40_000,
                attempt: 0,
                est_exec_ms: 0,
            })
            .collect();
        let settings = aging_threshold::Settings::default();
        let native = timed(|| {
            for _ in 0..rounds {
                std::hint::black_box(settings.age(4_000_000, &native_waiting));
            }
            Ok(())
        })?;
        Ok((wasm, native))
    }
}

struct MergeBench {
    instance: MergeInstance,
}

impl MergeBench {
    fn new(runtime: &Arc<PolicyRuntime>) -> anyhow::Result<Self> {
        let compiled = runtime.compile(Kind::Merge, defaults::MERGE_TOPK)?;
        Ok(MergeBench {
            instance: MergeInstance::new(runtime.clone(), &compiled, b"")?,
        })
    }

    /// `batch` hits in total, over 8 children, merged to the nearest `batch / 2`.
    fn run(&mut self, batch: usize, rounds: usize) -> anyhow::Result<(Duration, Duration)> {
        use merge::exports::sluice::policy::merge::{Hit, Part};
        let children = 8usize;
        let per_child = batch.div_ceil(children);
        let k = (batch / 2).max(1) as u32;
        let hits = |child: usize| -> Vec<(u64, f32)> {
            (0..per_child)
                .map(|i| {
                    (
                        (i * children + child) as u64,
                        (i * children + child) as f32 * 0.001,
                    )
                })
                .collect()
        };
        let parts: Vec<Part> = (0..children)
            .map(|child| Part {
                child: child as u32,
                weight: 1.0,
                hits: hits(child)
                    .into_iter()
                    .map(|(id, distance)| Hit { id, distance })
                    .collect(),
            })
            .collect();
        let instance = &mut self.instance;
        let wasm = timed(|| {
            for _ in 0..rounds {
                let merged = instance.merge(k, &parts)?;
                std::hint::black_box(
                    merged
                        .map_err(anyhow::Error::msg)
                        .context("merge refused")?,
                );
            }
            Ok(())
        })?;
        use merge_topk::exports::sluice::policy::merge as native;
        let native_parts: Vec<native::Part> = (0..children)
            .map(|child| native::Part {
                child: child as u32,
                weight: 1.0,
                hits: hits(child)
                    .into_iter()
                    .map(|(id, distance)| native::Hit { id, distance })
                    .collect(),
            })
            .collect();
        let native = timed(|| {
            for _ in 0..rounds {
                let merged =
                    merge_topk::merge(k, native_parts.clone()).map_err(anyhow::Error::msg)?;
                std::hint::black_box(merged);
            }
            Ok(())
        })?;
        Ok((wasm, native))
    }
}
