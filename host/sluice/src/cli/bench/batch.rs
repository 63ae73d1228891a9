//! `sluice bench batch`: the same load through the same reference workers twice — claiming
//! single tasks, then GPU batches — each on a fresh server: tasks per GPU-second, waits per
//! bucket, bucket and tenant shares among the first half claimed, and the checks that every
//! batch held one model and every task completed once (by the event log).

use super::child::ChildServer;
use anyhow::{Context, bail};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use sluice_client::worker::synthetic::Synthetic;
use sluice_client::worker::{Cancel, Executor, Outcome, WorkerConfig, run as run_worker};
use sluice_client::{BatchRequest, Client, LeaseGrant};
use sluice_model::{FailureClass, Gpu, Heartbeat, Priority};
use sluice_store_postgres::{is_postgres_url, redacted};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const MODELS: [&str; 2] = ["seg-v3", "denoise-v2"];
const TENANTS: usize = 3;

#[derive(clap::Args)]
pub struct BatchBenchArgs {
    /// A postgres:// URL: each run's server keeps its state in a new database there (dropped
    /// after) instead of sled in a temporary directory.
    #[arg(long)]
    store: Option<String>,
    /// Tasks of each run: two models, a tenth urgent, just over half normal, the rest low,
    /// three tenants.
    #[arg(long, default_value_t = 4_000)]
    tasks: usize,
    /// Reference workers, one GPU each.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// One task's time alone on a GPU, in ms.
    #[arg(long, default_value_t = 20)]
    exec_ms: u64,
    /// What each task past the first adds to a batch's time, as a share of one task's.
    #[arg(long, default_value_t = 0.1)]
    alpha: f64,
    /// The largest batch of the batching run.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// How long a batch short of its size waits for more.
    #[arg(long, default_value_t = 20)]
    batch_wait_ms: u64,
    /// Offer this many tasks a second (in groups of 10) instead of queueing them all first.
    #[arg(long)]
    rate: Option<u32>,
    /// Runs of each kind, alternating single and batched.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Draws the tasks' priorities, tenants and models.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// The synthetic executor, with a record of each batch: its size, and whether it mixed models.
struct Recording {
    synthetic: Synthetic,
    mixed_batches: AtomicU64,
    batches: AtomicU64,
}

impl Executor for Recording {
    async fn execute(&self, grant: &LeaseGrant, cancel: Cancel) -> Outcome {
        self.synthetic.execute(grant, cancel).await
    }

    async fn execute_batch(&self, grants: &[LeaseGrant], cancels: &[Cancel]) -> Vec<Outcome> {
        self.batches.fetch_add(1, Ordering::Relaxed);
        let model = |grant: &LeaseGrant| grant.task.resources.model.clone();
        if grants
            .iter()
            .any(|g| model(g) != grants.first().and_then(model))
        {
            self.mixed_batches.fetch_add(1, Ordering::Relaxed);
        }
        self.synthetic.execute_batch(grants, cancels).await
    }
}

/// What one run measured.
struct RunFigures {
    wall_s: f64,
    gpu_busy_s: f64,
    batches: u64,
    mixed_batches: u64,
    /// Submit → first claim, sorted, per submitted priority.
    waits_ms: BTreeMap<Priority, Vec<u64>>,
    /// Shares (%) among the first half of tasks claimed, by bucket and by tenant.
    bucket_shares: BTreeMap<String, f64>,
    tenant_shares: BTreeMap<String, f64>,
    completed: usize,
    completed_twice: usize,
}

pub async fn run(args: BatchBenchArgs) -> anyhow::Result<()> {
    if !(1..=1_000_000).contains(&args.tasks) {
        bail!("--tasks must be 1 to 1000000");
    }
    if !(1..=64).contains(&args.workers) {
        bail!("--workers must be 1 to 64");
    }
    if !(2..=sluice_wire::MAX_CLAIM).contains(&args.batch_size) {
        bail!("--batch-size must be 2 to {}", sluice_wire::MAX_CLAIM);
    }
    if args.batch_wait_ms > sluice_engine::MAX_BATCH_WAIT_MS {
        bail!(
            "--batch-wait-ms must be at most {}",
            sluice_engine::MAX_BATCH_WAIT_MS
        );
    }
    if !(0.0..=10.0).contains(&args.alpha) {
        bail!("--alpha must be 0 to 10");
    }
    if !(1..=10).contains(&args.rounds) {
        bail!("--rounds must be 1 to 10");
    }
    if !(1..=60_000).contains(&args.exec_ms) {
        bail!("--exec-ms must be 1 to 60000");
    }
    if args
        .rate
        .is_some_and(|rate| !(1..=1_000_000).contains(&rate))
    {
        bail!("--rate must be 1 to 1000000 tasks a second");
    }
    if let Some(store) = &args.store
        && !is_postgres_url(store)
    {
        bail!("--store takes a postgres:// or postgresql:// URL");
    }
    let store = args
        .store
        .as_deref()
        .map_or_else(|| "sled".to_owned(), redacted);
    outln!(
        "{} tasks ({} models, {TENANTS} tenants) through {} one-GPU workers, {} ms a task alone, \
         batch alpha {}, on {store}; {}",
        args.tasks,
        MODELS.len(),
        args.workers,
        args.exec_ms,
        args.alpha,
        args.rate.map_or_else(
            || "all queued before the workers start".to_owned(),
            |rate| format!("{rate} tasks/s offered")
        )
    )?;
    let mut runs: Vec<(&str, RunFigures)> = Vec::new();
    for _ in 0..args.rounds {
        for batched in [false, true] {
            let figures = one_run(&args, batched).await?;
            let name = if batched { "batched" } else { "single" };
            print_run(name, &args, &figures)?;
            runs.push((name, figures));
        }
    }
    let best = |name: &str| {
        runs.iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, f)| f)
            .next_back()
    };
    if let (Some(single), Some(batched)) = (best("single"), best("batched")) {
        let per_gpu = |f: &RunFigures| f.completed as f64 / f.gpu_busy_s.max(f64::EPSILON);
        outln!(
            "\nbatched against single (last round): {:.2}× the tasks per GPU-second; urgent wait \
             p99 {} ms against {} ms; largest share difference {:.1} points by bucket, {:.1} by \
             tenant",
            per_gpu(batched) / per_gpu(single),
            percentile(&batched.waits_ms[&Priority::Urgent], 0.99),
            percentile(&single.waits_ms[&Priority::Urgent], 0.99),
            largest_difference(&batched.bucket_shares, &single.bucket_shares),
            largest_difference(&batched.tenant_shares, &single.tenant_shares),
        )?;
    }
    Ok(())
}

fn print_run(name: &str, args: &BatchBenchArgs, figures: &RunFigures) -> anyhow::Result<()> {
    let claims = if name == "batched" {
        format!(
            "{} batches, {:.2} tasks a batch",
            figures.batches,
            figures.completed as f64 / figures.batches.max(1) as f64
        )
    } else {
        "one task per claim".to_owned()
    };
    outln!(
        "\n{name}: {} of {} completed in {:.2} s ({:.0} tasks/s); {claims}; {:.1} tasks per \
         GPU-second; GPU busy {:.1} s",
        figures.completed,
        args.tasks,
        figures.wall_s,
        figures.completed as f64 / figures.wall_s.max(f64::EPSILON),
        figures.completed as f64 / figures.gpu_busy_s.max(f64::EPSILON),
        figures.gpu_busy_s
    )?;
    for (priority, waits) in &figures.waits_ms {
        outln!(
            "  {:<7} wait p50 {} ms, p99 {} ms over {} tasks",
            priority.as_str(),
            percentile(waits, 0.5),
            percentile(waits, 0.99),
            waits.len()
        )?;
    }
    let shares = |shares: &BTreeMap<String, f64>| {
        shares
            .iter()
            .map(|(k, v)| format!("{k} {v:.1} %"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    outln!(
        "  first half claimed: {}; {}",
        shares(&figures.bucket_shares),
        shares(&figures.tenant_shares)
    )?;
    outln!(
        "  checks: {} batches mixing models, {} tasks completed more than once (event log)",
        figures.mixed_batches,
        figures.completed_twice
    )?;
    Ok(())
}

fn percentile(sorted: &[u64], q: f64) -> u64 {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(0)
}

fn largest_difference(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> f64 {
    a.keys()
        .chain(b.keys())
        .map(|k| (a.get(k).unwrap_or(&0.0) - b.get(k).unwrap_or(&0.0)).abs())
        .fold(0.0, f64::max)
}

/// The tasks of a run, the same for both kinds of run.
fn tasks(args: &BatchBenchArgs) -> Vec<Value> {
    let mut chance = SmallRng::seed_from_u64(args.seed);
    (0..args.tasks)
        .map(|_| {
            let priority = match chance.random_range(0..100) {
                0..10 => "urgent",
                10..65 => "normal",
                _ => "low",
            };
            let tenant = format!("site-{}", chance.random_range(0..TENANTS));
            let model = MODELS[chance.random_range(0..MODELS.len())];
            json!({
                "kind": "oct.infer",
                "priority": priority,
                "tenant": tenant,
                "est_exec_ms": args.exec_ms.max(1),
                "resources": {"model": model, "gpu_memory_mb": 1000},
            })
        })
        .collect()
}

async fn one_run(args: &BatchBenchArgs, batched: bool) -> anyhow::Result<RunFigures> {
    let store = args.store.clone();
    let child = tokio::task::spawn_blocking(move || match store {
        Some(store) => ChildServer::start_fresh_on_postgres(&store),
        None => ChildServer::start_fresh(),
    })
    .await??;
    let url = child.url.clone();
    let http = reqwest::Client::new();
    let client = Client::with_pool(&url, 64)?;
    let all = tasks(args);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let executors: Vec<Arc<Recording>> = (0..args.workers)
        .map(|n| {
            let mut synthetic = Synthetic::new(
                format!("gpu-{n}"),
                args.exec_ms,
                0.0,
                FailureClass::Transient,
                args.seed.wrapping_add(n as u64),
            );
            synthetic.batch_alpha = args.alpha;
            Arc::new(Recording {
                synthetic,
                mixed_batches: AtomicU64::new(0),
                batches: AtomicU64::new(0),
            })
        })
        .collect();
    let start_workers = || {
        let mut workers = tokio::task::JoinSet::new();
        for (n, executor) in executors.iter().enumerate() {
            let places = if batched { args.batch_size as u32 } else { 1 };
            let heartbeat = Heartbeat {
                gpus: vec![Gpu {
                    model: "synthetic".into(),
                    memory_mb: 40_000,
                    free: true,
                }],
                max_concurrency: places,
                ..Heartbeat::default()
            };
            let mut config = WorkerConfig::new(format!("gpu-{n}"), heartbeat);
            config.claim_wait_ms = 1_000;
            config.batch = batched.then(|| BatchRequest {
                max_size: args.batch_size,
                max_wait_ms: args.batch_wait_ms,
                models: Vec::new(),
            });
            let (client, executor, mut stopped) =
                (client.clone(), executor.clone(), stopped.clone());
            workers.spawn(async move {
                run_worker(client, config, executor, async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                })
                .await
            });
        }
        workers
    };
    let started = Instant::now();
    let workers = match args.rate {
        None => {
            submit(&http, &url, &all, None).await?;
            let started = Instant::now();
            (start_workers(), started)
        }
        Some(rate) => {
            let workers = start_workers();
            submit(&http, &url, &all, Some(rate)).await?;
            (workers, started)
        }
    };
    let (mut workers, started) = workers;
    wait_for_completed(&client, all.len()).await?;
    let wall_s = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    while let Some(joined) = workers.join_next().await {
        joined??;
    }
    let mut figures = read_back(&client).await?;
    figures.wall_s = wall_s;
    figures.gpu_busy_s = executors
        .iter()
        .map(|e| e.synthetic.gpu_busy().as_secs_f64())
        .sum();
    figures.batches = executors
        .iter()
        .map(|e| e.batches.load(Ordering::Relaxed))
        .sum();
    figures.mixed_batches = executors
        .iter()
        .map(|e| e.mixed_batches.load(Ordering::Relaxed))
        .sum();
    drop(child);
    Ok(figures)
}

/// Submits `all` in batches of 500, or in groups of 10 at `rate` a second.
async fn submit(
    http: &reqwest::Client,
    url: &str,
    all: &[Value],
    rate: Option<u32>,
) -> anyhow::Result<()> {
    let group = if rate.is_some() { 10 } else { 500 };
    let began = tokio::time::Instant::now();
    for (n, chunk) in all.chunks(group).enumerate() {
        if let Some(rate) = rate {
            let due = Duration::from_secs_f64((n * group) as f64 / f64::from(rate.max(1)));
            tokio::time::sleep_until(began + due).await;
        }
        let response = http
            .post(format!("{url}/v1/tasks:batch"))
            .json(&json!({ "tasks": chunk }))
            .send()
            .await
            .context("submit")?;
        if !response.status().is_success() {
            bail!("a submission was refused: {}", response.text().await?);
        }
    }
    Ok(())
}

async fn wait_for_completed(client: &Client, tasks: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(3_600);
    loop {
        let stats = client.stats().await?;
        let completed = stats["tasks_by_state"]["completed"].as_u64().unwrap_or(0);
        if completed as usize >= tasks {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{completed} of {tasks} completed after an hour");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits, shares and completions from the tasks and the event log.
async fn read_back(client: &Client) -> anyhow::Result<RunFigures> {
    let mut claimed: Vec<(u64, String, String)> = Vec::new();
    let mut waits_ms: BTreeMap<Priority, Vec<u64>> = BTreeMap::new();
    let mut completed = 0;
    let mut after: Option<String> = None;
    loop {
        let mut query = vec![("limit", "1000".to_owned())];
        query.extend(after.take().map(|after| ("after", after)));
        let page = client.list(&query).await?;
        for task in page["tasks"].as_array().context("tasks")? {
            let priority: Priority = serde_json::from_value(task["priority"].clone())?;
            let created = task["created_at_ms"].as_u64().unwrap_or(0);
            let first = task["first_claimed_at_ms"].as_u64().unwrap_or(created);
            waits_ms
                .entry(priority)
                .or_default()
                .push(first.saturating_sub(created));
            let tenant = task["tenant"].as_str().unwrap_or("").to_owned();
            claimed.push((first, priority.as_str().to_owned(), tenant));
            completed += usize::from(task["state"] == "completed");
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    waits_ms.values_mut().for_each(|w| w.sort_unstable());
    claimed.sort();
    let half = &claimed[..claimed.len() / 2];
    let share = |key: fn(&(u64, String, String)) -> &String| {
        let mut counts: BTreeMap<String, f64> = BTreeMap::new();
        for row in half {
            *counts.entry(key(row).clone()).or_default() += 1.0;
        }
        counts
            .values_mut()
            .for_each(|c| *c = 100.0 * *c / half.len().max(1) as f64);
        counts
    };
    let mut completions: BTreeMap<String, usize> = BTreeMap::new();
    let mut after_seq = 0;
    loop {
        let page = client.log(after_seq, 1_000).await?;
        let events = page["events"].as_array().context("events")?;
        let Some(last) = events.last() else { break };
        after_seq = last["seq"].as_u64().unwrap_or(u64::MAX);
        for event in events.iter().filter(|e| e["to"] == "completed") {
            *completions
                .entry(event["task_id"].as_str().unwrap_or("").to_owned())
                .or_default() += 1;
        }
    }
    Ok(RunFigures {
        wall_s: 0.0,
        gpu_busy_s: 0.0,
        batches: 0,
        mixed_batches: 0,
        waits_ms,
        bucket_shares: share(|row| &row.1),
        tenant_shares: share(|row| &row.2),
        completed,
        completed_twice: completions.values().filter(|&&n| n > 1).count(),
    })
}
