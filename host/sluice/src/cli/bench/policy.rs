//! `sluice bench policy`: what a decision costs in each default policy as a WASM component,
//! against the same crate's logic called natively, one at a time and in batches; how long
//! compiling a component and swapping in a fresh instance take; and the registry's own costs.
//!
//! WASM decisions go the way the server makes them: through the registry (the active chain,
//! an instance from the pool, the packed records, the answer checks).

use anyhow::Context;
use policy_packed::{Bucket, ErrorClass, Failure, Hit, View};
use sluice_model::{NamesRef, TaskNames};
use sluice_policy_runtime::{
    AgingInstance, Kind, MergeInstance, PolicyRegistry, PolicyRuntime, PriorityInstance,
    RegistryOptions, RetryInstance, RuntimeOptions, defaults,
};
use sluice_store_sled::{SledOptions, SledStore};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct PolicyBenchArgs {
    /// Decisions measured per (policy, batch size) pair.
    #[arg(long, default_value_t = 200_000)]
    decisions: usize,
    /// Measure the components in DIR (retry_backoff.wasm, priority_buckets.wasm,
    /// aging_threshold.wasm, merge_topk.wasm, as `cargo build` names them) instead of the
    /// embedded ones: one binary then compares two builds of the policies in one sitting.
    #[arg(long)]
    components: Option<std::path::PathBuf>,
}

/// The measured policies: name, kind, embedded bytes, file name in `--components`.
const MEASURED: [(&str, Kind, &[u8], &str); 4] = [
    (
        "priority-buckets",
        Kind::Priority,
        defaults::PRIORITY_BUCKETS,
        "priority_buckets.wasm",
    ),
    (
        "aging-threshold",
        Kind::Aging,
        defaults::AGING_THRESHOLD,
        "aging_threshold.wasm",
    ),
    (
        "retry-backoff",
        Kind::Retry,
        defaults::RETRY_BACKOFF,
        "retry_backoff.wasm",
    ),
    (
        "merge-topk",
        Kind::Merge,
        defaults::MERGE_TOPK,
        "merge_topk.wasm",
    ),
];

const BATCHES: [usize; 3] = [1, 100, 1000];
/// Each figure is the best of this many runs: on a shared VM the slower runs measure the
/// neighbours, not the code.
const REPEATS: usize = 5;

/// The fastest WASM and the fastest native time over `REPEATS` runs.
fn best_of(
    mut run: impl FnMut() -> anyhow::Result<(Duration, Duration)>,
) -> anyhow::Result<(Duration, Duration)> {
    let mut best = (Duration::MAX, Duration::MAX);
    for _ in 0..REPEATS {
        let (wasm, native) = run()?;
        best = (best.0.min(wasm), best.1.min(native));
    }
    Ok(best)
}

pub async fn run(args: PolicyBenchArgs) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        let components = match &args.components {
            Some(dir) => MEASURED
                .iter()
                .map(|(_, _, _, file)| {
                    let path = dir.join(file);
                    std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
            None => MEASURED
                .iter()
                .map(|(_, _, bytes, _)| bytes.to_vec())
                .collect(),
        };
        measure(args.decisions.clamp(1_000, 10_000_000), &components)
    })
    .await?
}

fn measure(decisions: usize, components: &[Vec<u8>]) -> anyhow::Result<()> {
    let runtime = Arc::new(PolicyRuntime::new(RuntimeOptions::default())?);
    outln!("(each figure: the best of {REPEATS} runs)")?;
    measure_compile_and_swap(&runtime, components)?;
    let dir = tempfile::tempdir().context("a temporary directory")?;
    let store = Arc::new(SledStore::open(dir.path(), &SledOptions::default())?);
    let registry = PolicyRegistry::open(runtime, store, RegistryOptions::default())?;
    measure_registry(&registry)?;
    // The measured components as the active versions (the embedded ones are version 0).
    for ((_, kind, _, _), bytes) in MEASURED.iter().zip(components) {
        let uploaded = registry.upload(*kind, bytes, None, 0)?;
        registry.activate(*kind, uploaded.version.version, 0)?;
    }

    outln!()?;
    outln!(
        "{:<18} {:>6} {:>14} {:>14} {:>8}",
        "policy",
        "batch",
        "wasm_ns/dec",
        "native_ns/dec",
        "ratio"
    )?;
    for batch in BATCHES {
        // Rounds per run; the runs together make `decisions`.
        let rounds = (decisions / batch / REPEATS).max(1);
        let report = |name: &str, (wasm, native): (Duration, Duration)| {
            let per = |d: Duration| d.as_nanos() as f64 / (rounds * batch) as f64;
            outln!(
                "{name:<18} {batch:>6} {:>14.1} {:>14.1} {:>8.1}",
                per(wasm),
                per(native),
                per(wasm) / per(native).max(0.001)
            )
        };
        report(
            "retry-backoff",
            best_of(|| retry(&registry, batch, rounds))?,
        )?;
        report(
            "priority-buckets",
            best_of(|| priority(&registry, batch, rounds))?,
        )?;
        report(
            "aging-threshold",
            best_of(|| aging(&registry, batch, rounds))?,
        )?;
        report(
            "merge-topk (hits)",
            best_of(|| merge(&registry, batch, rounds))?,
        )?;
    }
    // One vector query's merge as the scheduler runs it: 16 shards' top-10, merged to 10.
    let rounds = (decisions / 160 / REPEATS).max(1);
    let (wasm, native) = best_of(|| merge_cost(&registry, 16, 10, 10, rounds))?;
    let per_query = |d: Duration| d.as_nanos() as f64 / rounds as f64 / 1000.0;
    outln!(
        "merge of one query, 16 shards x 10 hits, k = 10: {:.2} us WASM, {:.2} us native",
        per_query(wasm),
        per_query(native)
    )?;
    Ok(())
}

/// What one decision of the active `kind` policy costs through `registry`, at each batch
/// size (`sluice policy bench`).
pub fn decision_costs(
    registry: &PolicyRegistry,
    kind: Kind,
    decisions: usize,
) -> anyhow::Result<()> {
    let decisions = decisions.clamp(1_000, 10_000_000);
    outln!(
        "{:>6} {:>14}   (best of {REPEATS} runs)",
        "batch",
        "ns/decision"
    )?;
    for batch in BATCHES {
        let rounds = (decisions / batch / REPEATS).max(1);
        let (wasm, _) = best_of(|| match kind {
            Kind::Retry => retry(registry, batch, rounds),
            Kind::Priority => priority(registry, batch, rounds),
            Kind::Aging => aging(registry, batch, rounds),
            Kind::Merge => merge(registry, batch, rounds),
            Kind::Split => anyhow::bail!(
                "split policies are not benched yet: their cost is one call per split task, timed by `sluice bench e2e`"
            ),
        })?;
        // A faulted call is answered by the fallback, so its time is not the policy's.
        let faults_total = registry.status(kind).counters.faults_total;
        if faults_total > 0 {
            anyhow::bail!(
                "a batch of {batch} faulted ({faults_total} faults; out of fuel or memory? see the log): raise --fuel or --memory-limit, and grant the same at upload"
            );
        }
        outln!(
            "{batch:>6} {:>14.1}",
            wasm.as_nanos() as f64 / (rounds * batch) as f64
        )?;
    }
    Ok(())
}

/// Compile and swap times, each the best of `REPEATS`; the first compile of all also pays for
/// the compiler's own start-up (the server pays it once, and only when its code cache is cold).
fn measure_compile_and_swap(
    runtime: &Arc<PolicyRuntime>,
    components: &[Vec<u8>],
) -> anyhow::Result<()> {
    outln!(
        "{:<18} {:>16} {:>10} {:>10}",
        "policy",
        "first_compile_ms",
        "compile_ms",
        "swap_ms"
    )?;
    for ((name, kind, _, _), bytes) in MEASURED.iter().zip(components) {
        let (name, kind) = (*name, *kind);
        let mut first_compile = None;
        let (compile, swap) = best_of(|| {
            let started = Instant::now();
            let compiled = runtime.compile(kind, bytes)?;
            let compile = started.elapsed();
            first_compile.get_or_insert(compile);
            // A swap is a fresh instance of the compiled component, initialised with its config.
            let started = Instant::now();
            match kind {
                Kind::Priority => drop(PriorityInstance::new(runtime.clone(), &compiled, b"")?),
                Kind::Aging => drop(AgingInstance::new(runtime.clone(), &compiled, b"")?),
                Kind::Retry => drop(RetryInstance::new(runtime.clone(), &compiled, b"")?),
                _ => drop(MergeInstance::new(runtime.clone(), &compiled, b"")?),
            }
            Ok((compile, started.elapsed()))
        })?;
        outln!(
            "{name:<18} {:>16.1} {:>10.1} {:>10.3}",
            ms(first_compile.unwrap_or(compile)),
            ms(compile),
            ms(swap)
        )?;
    }
    Ok(())
}

/// The registry's own costs on a real store (fdatasync on): storing a validated version, an
/// activation (its code from the cache), and a rollback.
fn measure_registry(registry: &PolicyRegistry) -> anyhow::Result<()> {
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
    let started = Instant::now();
    registry.rollback(Kind::Retry, 0)?;
    let rollback = started.elapsed();
    outln!()?;
    outln!(
        "registry (retry-backoff): upload {:.1} ms (validated, stored, synced; code cached), activate {:.2} ms, rollback {:.2} ms",
        ms(upload),
        ms(activate),
        ms(rollback),
    )?;

    // What one decision costs at the wasmtime boundary alone, and through the registry.
    let failure = Failure {
        task: view(1, Bucket::Normal, 0),
        class: ErrorClass::Transient,
        max_attempts: 3,
        random: 77,
    };
    let compiled = registry
        .runtime()
        .compile(Kind::Retry, defaults::RETRY_BACKOFF)?;
    let mut instance = RetryInstance::new(registry.runtime().clone(), &compiled, b"")?;
    let failure_names = names(1);
    let failure_refs = refs(&failure_names);
    let rounds = 40_000u32;
    let (direct, through) = best_of(|| {
        let direct = timed(|| {
            for _ in 0..rounds {
                std::hint::black_box(instance.decide_one(
                    1,
                    failure.words(),
                    failure_names[0].borrowed(),
                )?);
            }
            Ok(())
        })?;
        let through = timed(|| {
            for _ in 0..rounds {
                std::hint::black_box(registry.retry(
                    1,
                    None,
                    std::slice::from_ref(&failure),
                    &failure_refs,
                )?);
            }
            Ok(())
        })?;
        Ok((direct / rounds, through / rounds))
    })?;
    outln!(
        "one retry decision: {} ns calling the instance (decide-one), {} ns through the registry",
        direct.as_nanos(),
        through.as_nanos()
    )?;
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

fn view(seq: u64, bucket: Bucket, bucket_since_ms: u64) -> View {
    View {
        tenant: (seq % 7) as u32,
        kind: (seq % 3) as u32,
        bucket_since_ms,
        attempt: 1,
        est_exec_ms: 1000 + seq,
        ..View::in_bucket(seq, bucket)
    }
}

/// The names of tasks 0 to `count` - 1: as many tenants and kinds as their views' codes, a
/// device each, and labels on some (passed to every decision, read by the policies that read
/// names).
fn names(count: usize) -> Vec<TaskNames> {
    (0..count as u64)
        .map(|n| TaskNames {
            kind: format!("kind-{}", n % 3),
            tenant: format!("site-{}", n % 7),
            device: format!("scanner-{n}"),
            labels: if n % 4 == 0 {
                [("ed".to_owned(), "true".to_owned())].into()
            } else {
                Default::default()
            },
        })
        .collect()
}

fn refs(names: &[TaskNames]) -> Vec<NamesRef<'_>> {
    names.iter().map(TaskNames::borrowed).collect()
}

fn retry(
    registry: &PolicyRegistry,
    batch: usize,
    rounds: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let failures: Vec<Failure> = (0..batch as u64)
        .map(|n| Failure {
            task: view(n, Bucket::Normal, 0),
            class: ErrorClass::Transient,
            max_attempts: 3,
            random: n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        })
        .collect();
    let names = names(batch);
    let names = refs(&names);
    let wasm = timed(|| {
        for _ in 0..rounds {
            std::hint::black_box(registry.retry(1, None, &failures, &names)?);
        }
        Ok(())
    })?;
    let settings = retry_backoff::Settings::default();
    let native = timed(|| {
        for _ in 0..rounds {
            let out: Vec<_> = failures
                .iter()
                .map(|f| settings.decide(f.class, f.task.attempt, f.max_attempts, f.random))
                .collect();
            std::hint::black_box(out);
        }
        Ok(())
    })?;
    Ok((wasm, native))
}

fn priority(
    registry: &PolicyRegistry,
    batch: usize,
    rounds: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let tasks: Vec<View> = (0..batch as u64)
        .map(|n| view(n, Bucket::ALL[n as usize % 3], 0))
        .collect();
    let names = names(batch);
    let names = refs(&names);
    let wasm = timed(|| {
        for _ in 0..rounds {
            std::hint::black_box(registry.admit(1, None, &tasks, &names)?);
        }
        Ok(())
    })?;
    let settings = priority_buckets::Settings::default();
    let native = timed(|| {
        for _ in 0..rounds {
            let out: Vec<_> = tasks.iter().map(|t| settings.admit(t)).collect();
            std::hint::black_box(out);
        }
        Ok(())
    })?;
    Ok((wasm, native))
}

fn aging(
    registry: &PolicyRegistry,
    batch: usize,
    rounds: usize,
) -> anyhow::Result<(Duration, Duration)> {
    // A tenth of the tasks have waited past the threshold.
    let now_ms = 4_000_000;
    let waiting: Vec<View> = (0..batch as u64)
        .map(|n| {
            let since = if n % 10 == 0 { 0 } else { now_ms - 1000 };
            view(n, Bucket::Low, since)
        })
        .collect();
    let names = names(batch);
    let names = refs(&names);
    let wasm = timed(|| {
        for _ in 0..rounds {
            std::hint::black_box(registry.age(now_ms, None, &waiting, &names)?);
        }
        Ok(())
    })?;
    let settings = aging_threshold::Settings::default();
    let native = timed(|| {
        for _ in 0..rounds {
            std::hint::black_box(settings.age(now_ms, &waiting));
        }
        Ok(())
    })?;
    Ok((wasm, native))
}

/// `batch` hits in total, over 8 children, merged to the nearest `batch / 2`.
fn merge(
    registry: &PolicyRegistry,
    batch: usize,
    rounds: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let children = 8usize;
    merge_cost(
        registry,
        children,
        batch.div_ceil(children),
        (batch / 2).max(1) as u32,
        rounds,
    )
}

/// `rounds` merges of `children` × `per_child` hits to the nearest `k`, through the
/// registry (WASM) and natively.
fn merge_cost(
    registry: &PolicyRegistry,
    children: usize,
    per_child: usize,
    k: u32,
    rounds: usize,
) -> anyhow::Result<(Duration, Duration)> {
    let part = |child: usize| -> Vec<Hit> {
        (0..per_child)
            .map(|i| {
                let id = i * children + child;
                Hit {
                    id: id as u64,
                    distance: id as f32 * 0.001,
                }
            })
            .collect()
    };
    let mut packed = Vec::new();
    for child in 0..children {
        for hit in part(child) {
            hit.write_part(child as u32, &mut packed);
        }
    }
    let weights = vec![1.0; children];
    let wasm = timed(|| {
        for _ in 0..rounds {
            let merged = registry.merge(1, None, k, &weights, &packed)?;
            std::hint::black_box(
                merged
                    .answer
                    .map_err(anyhow::Error::msg)
                    .context("merge refused")?,
            );
        }
        Ok(())
    })?;
    let native_parts: Vec<merge_topk::Part> = (0..children)
        .map(|child| merge_topk::Part {
            child: child as u32,
            weight: 1.0,
            hits: part(child),
        })
        .collect();
    let native = timed(|| {
        for _ in 0..rounds {
            let merged = merge_topk::merge(k, native_parts.clone()).map_err(anyhow::Error::msg)?;
            std::hint::black_box(merged);
        }
        Ok(())
    })?;
    Ok((wasm, native))
}
