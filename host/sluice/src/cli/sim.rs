//! `sluice sim --trace FILE`: replays a trace on the virtual-time driver once per variant
//! (`--policy`, and `--compare` for a second), prints the comparison and writes report.json
//! and the SVG plots to `--out`. Stdout and the files depend on the inputs and the seed alone;
//! the wall time goes to stderr.

use anyhow::Context;
use sluice::replay::merges::{self, MergeVariant};
use sluice::replay::report::{SimReport, VariantReport};
use sluice::replay::{
    self, PolicyChoice, ReplayOptions, ServiceModel, SimBatch, Trace, Variant, WorkerSpec, svg,
};
use sluice::trace::TraceReader;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct SimArgs {
    /// A JSONL trace (docs/traces.md): `sluice trace gen` or `sluice trace import` make one.
    #[arg(long)]
    trace: PathBuf,
    /// The simulated fleet: COUNTxGPUS[:MEMORY_MB] groups, comma-separated; one attempt per
    /// GPU at a time.
    #[arg(long, default_value = "64x4:40000")]
    workers: String,
    /// KIND=builtin:NAME[?name=value&...] or KIND=FILE.wasm[?...]: variant A's component for
    /// a kind (the built-in defaults for the others). Repeat for several kinds.
    #[arg(long = "policy", value_name = "KIND=COMPONENT")]
    policies: Vec<String>,
    /// The same, for variant B, which keeps A's choices of the kinds it does not name.
    #[arg(long = "compare", value_name = "KIND=COMPONENT")]
    compares: Vec<String>,
    /// Fixes every draw: the same seed gives the same output, byte for byte.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where report.json, wait-cdf.svg and queue-depth.svg go.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Attempts that fail (transiently) beyond those the trace scripts, per thousand.
    #[arg(long, default_value_t = 0)]
    fail_per_mille: u32,
    /// Mean virtual ms between one worker's crashes (it goes silent holding its leases).
    #[arg(long)]
    mean_ms_between_crashes: Option<u64>,
    /// How long a crashed worker stays away.
    #[arg(long, default_value_t = 60_000)]
    restart_ms: u64,
    /// Each task's max_attempts.
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// Service times: `trace` (each task's `service_ms`), or drawn once per task from the
    /// seed: `fixed:MS`, `exp:MEAN_MS`, `lognormal:MEDIAN_MS:SIGMA`. Every variant runs a task
    /// for the same time.
    #[arg(long, default_value = "trace")]
    service: String,
    /// Turn preemption on: an urgent task that waited this long (virtual ms) with no worker
    /// free stops the lowest bucket's attempt (see docs/dispatch.md) [default: off]
    #[arg(long)]
    preempt_after_ms: Option<u64>,
    /// What loading its model adds to an attempt of a task naming one (the trace's `model`)
    /// on a GPU that last ran another; each GPU holds the model it ran last.
    #[arg(long, default_value_t = 0)]
    model_load_ms: u64,
    /// How long a task naming a model waits for a GPU with it loaded before it goes to one
    /// that must load it (the server's `affinity_wait_ms`).
    #[arg(long, default_value_t = sluice_engine::EngineOptions::default().affinity_wait_ms)]
    affinity_wait_ms: u64,
    /// Workers claim GPU batches of up to SIZE tasks of one kind and model, waiting up to
    /// WAIT_MS for a batch to fill (the server's batch_wait_ms caps it per bucket); each GPU
    /// runs one batch at a time [default: one task per GPU]
    #[arg(long, value_name = "SIZE[:WAIT_MS]")]
    batch: Option<String>,
    /// The same, for variant B (which keeps A's policies unless --compare names others);
    /// `1` compares against single tasks
    #[arg(long, value_name = "SIZE[:WAIT_MS]")]
    compare_batch: Option<String>,
    /// What each task past the first adds to a batch's time, as a share of its longest
    /// task's service time, 0 to 10: a batch of n takes service × (1 + alpha × (n − 1))
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    batch_alpha: f64,
    /// How long a claim or a lease heartbeat holds a task (the server's `lease_ms`). Simulated
    /// workers heartbeat each running attempt every third of it, so a trace of pods that run
    /// for hours replays far faster with a lease of an hour (which only delays the retry of a
    /// crashed worker's attempts)
    #[arg(long, default_value_t = sluice_engine::EngineOptions::default().lease_ms)]
    lease_ms: u64,
    /// Refuse a trace of more tasks (a million take about 60 MB per run).
    #[arg(long, default_value_t = 5_000_000)]
    max_tasks: usize,
    /// Instead of a replay, compare merge strategies over the trace's recorded searches
    /// (`sluice trace export --with-hits`): NAME=builtin:NAME[?name=value&...] or
    /// NAME=FILE.wasm[?...], once per variant (1 to 8), the first the baseline. Prints each
    /// one's recall@k against the exact merge of the same hits, as a merge experiment's report
    /// does (`--json`: the figures).
    #[arg(long = "merge", value_name = "NAME=COMPONENT")]
    merges: Vec<String>,
    /// With --merge: print the figures as JSON.
    #[arg(long, requires = "merges")]
    json: bool,
}

/// `--merge`: every recorded search merged by each variant, and their figures.
fn compare_merges(args: &SimArgs) -> anyhow::Result<()> {
    let variants = args
        .merges
        .iter()
        .map(|text| Ok(text.parse::<MergeVariant>()?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let file = std::fs::File::open(&args.trace)
        .with_context(|| format!("cannot open {}", args.trace.display()))?;
    let reader = TraceReader::new(std::io::BufReader::new(file));
    let compared = merges::compare(reader.take(args.max_tasks), &variants)
        .with_context(|| format!("cannot compare merges over {}", args.trace.display()))?;
    if compared.searches == 0 {
        anyhow::bail!(
            "{} holds no recorded search: export it with `sluice trace export --with-hits`",
            args.trace.display()
        );
    }
    if args.json {
        let figures: serde_json::Map<String, serde_json::Value> = compared
            .variants
            .iter()
            .map(|(name, figures)| Ok((name.clone(), serde_json::to_value(figures)?)))
            .collect::<anyhow::Result<_>>()?;
        outln!("{}", serde_json::to_string_pretty(&figures)?)?;
        return Ok(());
    }
    outln!(
        "{} recorded searches merged by {} variant(s) ({} other tasks left out)",
        compared.searches,
        variants.len(),
        compared.other_tasks
    )?;
    for (name, figures) in &compared.variants {
        outln!("\nvariant {name}:\n  {}", figures.line())?;
        if let Some(verdict) = &figures.verdict {
            outln!("verdict: {verdict}")?;
        }
    }
    Ok(())
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    if !args.merges.is_empty() {
        return compare_merges(&args);
    }
    if args
        .preempt_after_ms
        .is_some_and(|ms| !(100..=86_400_000).contains(&ms))
    {
        anyhow::bail!("--preempt-after-ms must be 100 to 86400000");
    }
    if args.model_load_ms > 3_600_000 || args.affinity_wait_ms > 86_400_000 {
        anyhow::bail!("--model-load-ms is at most 3600000 and --affinity-wait-ms 86400000");
    }
    if !(100..=86_400_000).contains(&args.lease_ms) {
        anyhow::bail!("--lease-ms must be 100 to 86400000");
    }
    if args.fail_per_mille > 1_000 {
        anyhow::bail!("--fail-per-mille is at most 1000");
    }
    if args.max_attempts == 0 || args.max_attempts > sluice_model::MAX_ATTEMPTS {
        anyhow::bail!("--max-attempts must be 1 to {}", sluice_model::MAX_ATTEMPTS);
    }
    let workers: WorkerSpec = args.workers.parse()?;
    let service: ServiceModel = args.service.parse()?;
    let parse = |texts: &[String]| -> anyhow::Result<Vec<PolicyChoice>> {
        texts.iter().map(|t| Ok(t.parse()?)).collect()
    };
    if !(0.0..=10.0).contains(&args.batch_alpha) {
        anyhow::bail!("--batch-alpha must be 0 to 10");
    }
    let parse_batch = |flag: &str, text: &Option<String>| -> anyhow::Result<Option<SimBatch>> {
        text.as_deref()
            .map(|text| SimBatch::parse(text, args.batch_alpha))
            .transpose()
            .map_err(|error| anyhow::anyhow!("{flag}: {error}"))
    };
    let batch_a = parse_batch("--batch", &args.batch)?;
    let batch_b = parse_batch("--compare-batch", &args.compare_batch)?;
    let mut variants = Variant::pair(parse(&args.policies)?, parse(&args.compares)?)?;
    if args.compare_batch.is_some() && variants.len() == 1 {
        let mut second = variants[0].clone();
        second.name = "B".into();
        variants.push(second);
    }
    // Each variant's batches: A's, and B's when --compare-batch names them.
    let batches: Vec<Option<SimBatch>> = (0..variants.len())
        .map(|n| match n {
            0 => batch_a,
            _ if args.compare_batch.is_some() => batch_b,
            _ => batch_a,
        })
        .collect();
    let file = std::fs::File::open(&args.trace)
        .with_context(|| format!("cannot open {}", args.trace.display()))?;
    let started = Instant::now();
    let mut trace = Trace::read(std::io::BufReader::new(file), args.max_tasks)
        .with_context(|| format!("cannot read {}", args.trace.display()))?;
    trace.draw_service(service, args.seed)?;
    let options = ReplayOptions {
        workers,
        seed: args.seed,
        fail_per_mille: args.fail_per_mille,
        mean_ms_between_crashes: args.mean_ms_between_crashes,
        restart_ms: args.restart_ms,
        max_attempts: args.max_attempts,
        model_load_ms: args.model_load_ms,
        engine: sluice_engine::EngineOptions {
            preempt_after_ms: args.preempt_after_ms,
            affinity_wait_ms: args.affinity_wait_ms,
            lease_ms: args.lease_ms,
            ..sluice_engine::EngineOptions::default()
        },
        ..ReplayOptions::default()
    };
    // Each variant on a thread of its own: the runs share only the trace, so this changes
    // no figure.
    let outcomes: Vec<anyhow::Result<VariantReport>> = std::thread::scope(|scope| {
        let runs: Vec<_> = variants
            .iter()
            .zip(&batches)
            .map(|(variant, &batch)| {
                let trace = &trace;
                let options = ReplayOptions {
                    batch,
                    ..options.clone()
                };
                scope.spawn(move || -> anyhow::Result<VariantReport> {
                    let outcome = replay::run(trace, variant, &options)
                        .with_context(|| format!("variant {}", variant.name))?;
                    let mut report = VariantReport::new(variant, trace, outcome);
                    report.batch = batch.map(|batch| batch.to_string());
                    Ok(report)
                })
            })
            .collect();
        runs.into_iter()
            .map(|run| {
                run.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a variant's run panicked")))
            })
            .collect()
    });
    let reports = outcomes.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    let report = SimReport::new(&trace, args.seed, args.workers.clone(), reports);
    let wall_s = started.elapsed().as_secs_f64();
    for line in report.text().lines() {
        outln!("{line}")?;
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        let mut json = serde_json::to_vec_pretty(&report)?;
        json.push(b'\n');
        for (name, bytes) in [
            ("report.json", json),
            ("wait-cdf.svg", svg::wait_cdf(&report).into_bytes()),
            ("queue-depth.svg", svg::queue_depth(&report).into_bytes()),
        ] {
            let path = out.join(name);
            std::fs::write(&path, bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    eprintln!(
        "simulated {} tasks × {} variant(s) in {wall_s:.2} s of wall time",
        trace.len(),
        variants.len()
    );
    Ok(())
}
