//! `sluice demo`: the first thing to run. An embedded server (the default store in a temporary folder, or
//! `--data-dir`), in-process vector shard workers and synthetic GPU workers, a mixed load of
//! OCT inference tasks in three priorities and vector searches through split and merge, a live
//! line of progress, and a summary to end with.

mod load;
mod summary;

use anyhow::Context;
use sluice::vector::{ShardIndex, ShardPart, VectorExecutor, clustered};
use sluice_client::Client;
use sluice_client::worker::synthetic::Synthetic;
use sluice_client::worker::{Executor, WorkerConfig};
use sluice_engine::{COLLECTION_LABEL, SHARD_LABEL};
use sluice_model::{Gpu, Heartbeat, PolicyKind, ShardAnnouncement};
use sluice_server::config::ServeConfig;
use sluice_server::server::Server;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Keep the state in this folder (created if missing) instead of a temporary one
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// OCT inference tasks to submit
    #[arg(long, default_value_t = 600)]
    tasks: usize,
    /// Vector searches to submit
    #[arg(long, default_value_t = 120)]
    searches: usize,
    /// Stored shards of the vector set, one worker each
    #[arg(long, default_value_t = 4)]
    shards: u32,
    /// Synthetic GPU workers
    #[arg(long, default_value_t = 6)]
    gpu_workers: usize,
    /// Seconds over which the second half of the load arrives (the first half comes at once)
    #[arg(long, default_value_t = 12)]
    pace_s: u64,
    /// Seed of the data, the load and the synthetic failures
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

/// Waits (a few seconds at most) until every shard worker's heartbeat has reached the server,
/// so no search is split while a shard is still missing; the collection's line to print.
async fn wait_for_shards(client: &Client, shards: u32) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let known = client.collections(Some(load::COLLECTION)).await.ok();
        let live = known
            .as_ref()
            .and_then(|c| c["live_shards"].as_u64())
            .unwrap_or(0);
        if live == u64::from(shards) {
            return Ok(format!(
                "collection {}: {live} of {shards} shards live, {} dimensions, {}",
                load::COLLECTION,
                known.as_ref().map_or(0, |c| c["dim"].as_u64().unwrap_or(0)),
                known
                    .as_ref()
                    .and_then(|c| c["metric"].as_str())
                    .unwrap_or("l2"),
            ));
        }
        if Instant::now() > deadline {
            anyhow::bail!("only {live} of {shards} shard workers reached the server in 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The demo's vector set: clustered, as embeddings are.
const VECTOR_ROWS: usize = 20_000;
const VECTOR_DIM: usize = 32;

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if !(1..=100_000).contains(&args.tasks) || args.searches > 10_000 {
        anyhow::bail!("--tasks must be 1 to 100000 and --searches at most 10000");
    }
    if args.pace_s > 600 {
        anyhow::bail!("--pace-s must be at most 600");
    }
    if !(1..=64).contains(&args.shards) || !(1..=64).contains(&args.gpu_workers) {
        anyhow::bail!("--shards and --gpu-workers must be 1 to 64");
    }
    let temporary = match &args.data_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("cannot make a temporary folder")?),
    };
    let data_dir = match (&args.data_dir, &temporary) {
        (Some(dir), _) => dir.clone(),
        (None, Some(temp)) => temp.path().to_path_buf(),
        (None, None) => unreachable!("one of the two is set"),
    };
    outln!("Sluice demo: state in {}", data_dir.display())?;

    let vectors = clustered(VECTOR_ROWS, VECTOR_DIM, 48, args.seed);
    let mut config = ServeConfig {
        data_dir: data_dir.clone(),
        listen: ([127, 0, 0, 1], 0).into(),
        ..ServeConfig::default()
    };
    // Seconds rather than minutes, so retries and aging show within the demo.
    config.policy_configs.insert(
        PolicyKind::Retry,
        "initial_delay_ms=300\nmax_delay_ms=3000".into(),
    );
    config.policy_configs.insert(
        PolicyKind::Aging,
        "low_to_normal_ms=8000\nnormal_to_urgent_ms=12000".into(),
    );
    config.check().context("demo settings")?;
    let server = tokio::task::spawn_blocking(move || Server::open(&config))
        .await?
        .context("cannot open the server")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(listener, async move {
        let _ = server_stopped.await;
    }));
    outln!("API on {url}\n")?;

    let client = Client::with_pool(&url, 64)?;
    let (stop_workers, stopping) = watch::channel(false);
    let mut workers = tokio::task::JoinSet::new();
    let vectors = Arc::new(vectors);
    for index in 0..args.shards {
        let part = ShardPart {
            index,
            count: args.shards,
        };
        let shard = ShardIndex::from_rows(&vectors, Some(part));
        let mut heartbeat = Heartbeat {
            kinds: vec!["vector.search".into()],
            max_concurrency: 4,
            ..Heartbeat::default()
        };
        heartbeat.labels.insert(SHARD_LABEL.into(), shard.routing());
        heartbeat
            .labels
            .insert(COLLECTION_LABEL.into(), load::COLLECTION.into());
        heartbeat.vectors = Some(ShardAnnouncement {
            collection: load::COLLECTION.into(),
            shard: index,
            shards: args.shards,
            dim: VECTOR_DIM as u32,
            vectors: shard.len() as u64,
        });
        let executor = VectorExecutor {
            index: Arc::new(shard),
            delay_ms: 0,
        };
        spawn_worker(
            &mut workers,
            &client,
            format!("shard-{index}"),
            heartbeat,
            executor,
            &stopping,
        );
    }
    for w in 0..args.gpu_workers {
        let heartbeat = Heartbeat {
            gpus: vec![Gpu {
                model: "A100".into(),
                memory_mb: 40_000,
                free: true,
            }],
            kinds: vec!["oct.analyze".into()],
            max_concurrency: 1,
            ..Heartbeat::default()
        };
        let name = format!("gpu-{w}");
        // One worker in six is flaky, so retries, backoff and its breaker show.
        let fail_rate = if w % 6 == 5 { 0.5 } else { 0.03 };
        let executor = Synthetic::new(
            name.clone(),
            120,
            fail_rate,
            sluice_model::FailureClass::Transient,
            args.seed + w as u64,
        );
        spawn_worker(&mut workers, &client, name, heartbeat, executor, &stopping);
    }

    let layout = wait_for_shards(&client, args.shards).await?;
    outln!("{layout}\n")?;
    let started = Instant::now();
    let plan = load::Plan::new(args.tasks, args.searches, &vectors, args.seed);
    let pace = Duration::from_secs(args.pace_s);
    // Every task ends, and so does each search's parent and its children.
    let expected = (plan.len() + plan.searches() * args.shards as usize) as u64;
    let submitting = tokio::spawn(load::submit_all(client.clone(), plan, pace));
    summary::watch_until_done(&client, expected, &submitting, started).await?;
    let elapsed = started.elapsed();
    let submitted = submitting.await??;
    let report = summary::Summary::gather(&client, submitted, &vectors, elapsed).await?;
    // Printed before the workers and the server stop; a failure to print is reported after.
    let printed = report.print(&url);

    let _ = stop_workers.send(true);
    while workers.join_next().await.is_some() {}
    let _ = stop_server.send(());
    serving.await??;
    printed?;
    match temporary {
        Some(temp) => drop(temp),
        None => outln!("\nState kept in {}", data_dir.display())?,
    }
    Ok(())
}

fn spawn_worker<E: Executor>(
    workers: &mut tokio::task::JoinSet<()>,
    client: &Client,
    id: String,
    heartbeat: Heartbeat,
    executor: E,
    stopping: &watch::Receiver<bool>,
) {
    let mut config = WorkerConfig::new(id.clone(), heartbeat);
    config.claim_wait_ms = 1_000;
    config.heartbeat_interval = Duration::from_millis(500);
    let (client, mut stopping) = (client.clone(), stopping.clone());
    workers.spawn(async move {
        let shutdown = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        if let Err(error) =
            sluice_client::worker::run(client, config, Arc::new(executor), shutdown).await
        {
            eprintln!("worker {id} stopped: {error}");
        }
    });
}
