//! `sluice bench e2e`: end-to-end tasks per second over HTTP, each step answered only once the
//! server has made it durable (leases as `sync_claims` says): tasks are
//! submitted in batches while workers claim them (in batches, long-polling) and report each
//! claimed batch complete in one request; and the claim latency the workers see.

use super::child::ChildServer;
use super::cpu;
use super::server_histograms::{self as histograms, Buckets};
use anyhow::{Context, bail};
use sluice_client::Client;
use sluice_model::{Gpu, Heartbeat};
use sluice_store_postgres::{is_postgres_url, redacted};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct E2eBenchArgs {
    /// Measure this server instead of starting a fresh `sluice serve` on a temporary directory.
    #[arg(long)]
    server: Option<String>,
    /// A postgres:// URL: the fresh server keeps its state in a new database on that
    /// PostgreSQL server (created for the run, dropped after) instead of sled.
    #[arg(long, conflicts_with = "server")]
    store: Option<String>,
    /// Tasks to push through.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Concurrent workers.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Tasks one claim asks for (1 to 64); also each worker's concurrency.
    #[arg(long, default_value_t = 32)]
    claim_batch: usize,
    /// Concurrent submitting clients, each sending batches of 100 tasks.
    #[arg(long, default_value_t = 4)]
    submitters: usize,
    /// Submit every task first, then start the workers: measures claim → complete alone.
    #[arg(long)]
    prefill: bool,
    /// Offer this many tasks a second (batches of 100 sent on a fixed schedule) instead of
    /// submitting as fast as the server answers: latency at a given load, not at saturation.
    #[arg(long, conflicts_with = "prefill")]
    rate: Option<u32>,
}

pub async fn run(args: E2eBenchArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.tasks > 10_000_000 {
        bail!("--tasks must be 1 to 10000000");
    }
    if !(1..=1024).contains(&args.workers) || !(1..=64).contains(&args.claim_batch) {
        bail!("--workers must be 1 to 1024 and --claim-batch 1 to 64");
    }
    if !(1..=256).contains(&args.submitters) {
        bail!("--submitters must be 1 to 256");
    }
    if args
        .rate
        .is_some_and(|rate| !(1..=1_000_000).contains(&rate))
    {
        bail!("--rate must be 1 to 1000000 tasks a second");
    }
    let (url, child) = match (&args.server, &args.store) {
        (Some(url), _) => (url.clone(), None),
        (None, store) => {
            let store = store.clone();
            let child = tokio::task::spawn_blocking(move || match store {
                Some(store) if is_postgres_url(&store) => {
                    ChildServer::start_fresh_on_postgres(&store)
                }
                Some(_) => bail!("--store takes a postgres:// or postgresql:// URL"),
                None => ChildServer::start_fresh(),
            })
            .await??;
            (child.url.clone(), Some(child))
        }
    };
    let client = Client::with_pool(&url, 256)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .context("HTTP client")?;
    let nonce = std::process::id();
    let metrics_before = histograms::scrape(&http, &url).await?;
    let done = Arc::new(AtomicUsize::new(0));
    let server_pid = child.as_ref().map(ChildServer::pid);
    let cpu_before = cpu::sample(server_pid);
    let started = Instant::now();

    let mut workers = tokio::task::JoinSet::new();
    let start_workers = |workers: &mut tokio::task::JoinSet<_>| {
        for w in 0..args.workers {
            let (client, done) = (client.clone(), done.clone());
            let (total, batch) = (args.tasks, args.claim_batch);
            workers.spawn(async move {
                worker(client, format!("bench-{nonce}-{w}"), batch, total, done).await
            });
        }
    };
    if !args.prefill {
        start_workers(&mut workers);
    }
    let mut submitters = tokio::task::JoinSet::new();
    let next = Arc::new(AtomicUsize::new(0));
    let schedule = args.rate.map(|rate| (tokio::time::Instant::now(), rate));
    for _ in 0..args.submitters {
        let (http, next, url) = (http.clone(), next.clone(), url.clone());
        let total = args.tasks;
        submitters.spawn(async move { submit(http, url, next, total, nonce, schedule).await });
    }
    while let Some(joined) = submitters.join_next().await {
        joined??;
    }
    let submitted_after = started.elapsed();
    let (started, cpu_before) = if args.prefill {
        start_workers(&mut workers);
        (Instant::now(), cpu::sample(server_pid))
    } else {
        (started, cpu_before)
    };
    let mut claim_us: Vec<u32> = Vec::new();
    let mut empty_claims = 0usize;
    while let Some(joined) = workers.join_next().await {
        let (latencies, empty) = joined??;
        claim_us.extend(latencies);
        empty_claims += empty;
    }
    let elapsed = started.elapsed();
    let cpu_after = cpu::sample(server_pid);
    claim_us.sort_unstable();
    let pct = |q: f64| {
        claim_us
            .get(((claim_us.len().max(1) - 1) as f64 * q).round() as usize)
            .map_or(f64::NAN, |&us| f64::from(us) / 1000.0)
    };
    let store = match &args.store {
        Some(store) => format!(" on {}", redacted(store)),
        None if args.server.is_none() => " on the embedded store".to_owned(),
        None => String::new(),
    };
    outln!(
        "end to end over HTTP at {url}{store}: {} tasks, {} workers claiming up to {} each, {} submitters{}",
        args.tasks,
        args.workers,
        args.claim_batch,
        args.submitters,
        args.rate
            .map(|rate| format!(" offering {rate} tasks/s"))
            .unwrap_or_default()
    )?;
    let what = if args.prefill {
        "claim → complete, after all were submitted"
    } else {
        "submit → claim → complete"
    };
    outln!(
        "tasks/s {:.0} ({what}, every step durable); all submitted after {:.2} s, all complete {:.2} s after the start",
        args.tasks as f64 / elapsed.as_secs_f64(),
        submitted_after.as_secs_f64(),
        elapsed.as_secs_f64()
    )?;
    let within_5_ms = claim_us.iter().filter(|&&us| us <= 5_000).count();
    outln!(
        "claim latency with work: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, {:.1} % ≤ 5 ms over {} claims ({} came back empty)",
        pct(0.50),
        pct(0.99),
        pct(0.999),
        100.0 * within_5_ms as f64 / claim_us.len().max(1) as f64,
        claim_us.len(),
        empty_claims
    )?;
    outln!(
        "  (at the workers, request to answer, less the long-poll wait for work the server reports in `waited_for_work_us`)"
    )?;
    let metrics_after = histograms::scrape(&http, &url).await?;
    for (what, name) in [
        (
            "claims with work, at the server",
            "sluice_claim_grant_seconds",
        ),
        ("group-commit syncs", "sluice_store_sync_seconds"),
    ] {
        let run =
            Buckets::parse(&metrics_after, name).since(&Buckets::parse(&metrics_before, name));
        outln!(
            "  {what}: {} over {} (bucket bounds, from /metrics)",
            histograms::describe(&run),
            run.count()
        )?;
    }
    if let Some(line) = cpu_before
        .zip(cpu_after)
        .and_then(|(b, a)| cpu::describe(b, a))
    {
        outln!("{line}")?;
    }
    drop(child);
    Ok(())
}

async fn submit(
    http: reqwest::Client,
    url: String,
    next: Arc<AtomicUsize>,
    total: usize,
    nonce: u32,
    schedule: Option<(tokio::time::Instant, u32)>,
) -> anyhow::Result<()> {
    const BATCH: usize = 100;
    loop {
        let first = next.fetch_add(BATCH, Ordering::Relaxed);
        if first >= total {
            return Ok(());
        }
        // Batch k is due at start + k·100/rate; one that falls behind goes at once.
        if let Some((start, rate)) = schedule {
            let due_s = first as f64 / f64::from(rate);
            tokio::time::sleep_until(start + Duration::from_secs_f64(due_s)).await;
        }
        let tasks: Vec<BenchTask> = (first..(first + BATCH).min(total))
            .map(|n| BenchTask {
                kind: "bench.e2e",
                priority: ["urgent", "normal", "low"][n % 3],
                key: format!("e2e-{nonce}-{n}"),
                payload: BenchPayload { n },
            })
            .collect();
        let response = http
            .post(format!("{url}/v1/tasks:batch"))
            .json(&BenchBatch { tasks })
            .send()
            .await?;
        if !response.status().is_success() {
            bail!("batch submission answered {}", response.status());
        }
    }
}

// The bench's own requests and answers are typed, not `serde_json::Value`s: the client shares
// the two cores with the server it measures, and should cost it as little as it can.

#[derive(serde::Serialize)]
struct BenchBatch {
    tasks: Vec<BenchTask>,
}

#[derive(serde::Serialize)]
struct BenchTask {
    kind: &'static str,
    priority: &'static str,
    key: String,
    payload: BenchPayload,
}

#[derive(serde::Serialize)]
struct BenchPayload {
    n: usize,
}

#[derive(serde::Serialize)]
struct Completion<'a> {
    report: &'static str,
    task: sluice_model::TaskId,
    lease_token: &'a str,
    result: CompleteResult,
}

#[derive(serde::Serialize)]
struct CompleteResult {
    ok: bool,
}

/// Of each answer only its status is read; serde skips the rest without building it.
#[derive(serde::Deserialize)]
struct Answers {
    results: Vec<ItemStatus>,
}

#[derive(serde::Deserialize)]
struct ItemStatus {
    status: u16,
}

/// Claims and completes until `total` tasks are done across all workers; returns the latency
/// of each claim that brought work, and how many came back empty.
async fn worker(
    client: Client,
    id: String,
    batch: usize,
    total: usize,
    done: Arc<AtomicUsize>,
) -> anyhow::Result<(Vec<u32>, usize)> {
    let heartbeat = Heartbeat {
        gpus: vec![
            Gpu {
                model: "bench".into(),
                memory_mb: 80_000,
                free: true,
            };
            batch
        ],
        max_concurrency: batch as u32,
        ..Heartbeat::default()
    };
    client.worker_heartbeat(&id, &heartbeat).await?;
    let mut latencies = Vec::new();
    let mut empty = 0;
    let mut last_beat = Instant::now();
    while done.load(Ordering::Relaxed) < total {
        if last_beat.elapsed() > Duration::from_secs(5) {
            client.worker_heartbeat(&id, &heartbeat).await?;
            last_beat = Instant::now();
        }
        let sent = Instant::now();
        let claimed = client.claim(&id, batch, 200, None).await?;
        if claimed.leases.is_empty() {
            empty += 1;
            continue;
        }
        // Below capacity a claim long-polls for work; that wait is the load's, not latency.
        let claim_us =
            (sent.elapsed().as_micros() as u64).saturating_sub(claimed.waited_for_work_us);
        latencies.push(claim_us.min(u64::from(u32::MAX)) as u32);
        // The batch ran together, as batched inference does: one report for all of it.
        let reports: Vec<Completion> = claimed
            .leases
            .iter()
            .map(|grant| Completion {
                report: "complete",
                task: grant.task.id,
                lease_token: &grant.lease_token,
                result: CompleteResult { ok: true },
            })
            .collect();
        let answer: Answers = client.report_batch(&reports).await?;
        let completed = answer.results.iter().filter(|r| r.status == 200).count();
        if completed != claimed.leases.len() {
            bail!(
                "{} of {} completions were refused",
                claimed.leases.len() - completed,
                claimed.leases.len()
            );
        }
        done.fetch_add(completed, Ordering::Relaxed);
    }
    Ok((latencies, empty))
}
