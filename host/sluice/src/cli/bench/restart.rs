//! `sluice bench restart`: fill a temporary store with N queued tasks through the scheduler,
//! then start a real `sluice serve` on it and time how long it takes to be ready (reopening
//! the store and rebuilding the in-memory indexes), and how much memory it then holds.

use super::child::ChildServer;
use anyhow::{Context, bail};
use sluice_engine::NativeDecider;
use sluice_model::{Limits, Submission, TaskSpec};
use sluice_server::scheduler::{Scheduler, SchedulerOptions, SystemClock};
use sluice_store_sled::{SledOptions, SledStore};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct RestartBenchArgs {
    /// Tasks to store before the restart.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: usize,
    /// Size of each task's payload.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
}

/// Tasks per scheduler call while filling, as a batch request would send them.
const FILL_BATCH: usize = 1000;

pub async fn run(args: RestartBenchArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.tasks > 10_000_000 {
        bail!("--tasks must be 1 to 10000000");
    }
    let dir = tempfile::tempdir().context("cannot create a temporary data directory")?;
    let fill_started = Instant::now();
    fill(dir.path(), args.tasks, args.payload_bytes).await?;
    let fill_s = fill_started.elapsed().as_secs_f64();
    let disk_bytes = directory_bytes(dir.path())?;

    let server = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || ChildServer::start(&dir)
    })
    .await??;
    let stats: serde_json::Value = reqwest::get(format!("{}/v1/stats", server.url))
        .await?
        .json()
        .await?;
    let queued = stats["tasks_by_state"]["queued"].as_u64().unwrap_or(0);
    if queued != args.tasks as u64 {
        bail!(
            "after the restart {queued} tasks are queued, not {}",
            args.tasks
        );
    }
    outln!("tasks                {}", args.tasks)?;
    outln!(
        "fill_s               {fill_s:.1} ({:.0} tasks/s, in process, batches of {FILL_BATCH})",
        args.tasks as f64 / fill_s
    )?;
    outln!(
        "disk_bytes           {disk_bytes} ({:.0} B per task)",
        disk_bytes as f64 / args.tasks as f64
    )?;
    outln!(
        "restart_to_ready_s   {:.2}",
        server.ready_after.as_secs_f64()
    )?;
    if let Some(rss) = server.resident_bytes() {
        outln!(
            "server_rss_mb        {:.0} ({:.0} B per stored task)",
            rss as f64 / 1e6,
            rss as f64 / args.tasks as f64
        )?;
    }
    Ok(())
}

fn open(dir: &Path) -> anyhow::Result<Scheduler> {
    let store = SledStore::open(dir, &SledOptions::default())?;
    Ok(Scheduler::start(
        Arc::new(store),
        Box::new(SystemClock),
        Arc::new(NativeDecider::default()),
        &SchedulerOptions::default(),
    )?)
}

async fn fill(dir: &Path, tasks: usize, payload_bytes: usize) -> anyhow::Result<()> {
    let scheduler = open(dir)?;
    let payload = "x".repeat(payload_bytes);
    let limits = Limits::default();
    let mut made = 0;
    while made < tasks {
        let count = FILL_BATCH.min(tasks - made);
        let mut batch: Vec<Submission> = Vec::with_capacity(count);
        for n in made..made + count {
            let priority = ["urgent", "normal", "low"][n % 3];
            let spec: TaskSpec = serde_json::from_value(serde_json::json!({
                "kind": "bench.restart", "key": format!("restart-{n}"),
                "priority": priority, "payload": payload,
            }))?;
            batch.push(spec.into_submission(None, &limits)?);
        }
        for answer in scheduler.submit_many(batch).await? {
            answer?;
        }
        made += count;
    }
    scheduler.shutdown().await;
    Ok(())
}

fn directory_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        total += if metadata.is_dir() {
            directory_bytes(&entry.path())?
        } else {
            metadata.len()
        };
    }
    Ok(total)
}
