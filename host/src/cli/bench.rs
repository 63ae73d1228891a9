//! `sluice bench submit`: durable submissions per second over real HTTP, and the latency from
//! request to acknowledgement, at several numbers of concurrent clients.

use anyhow::{Context, bail};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Submissions/s and acknowledgement latency p50/p99 at each client count.
    Submit(SubmitBenchArgs),
}

#[derive(clap::Args)]
pub struct SubmitBenchArgs {
    /// Measure this server instead of starting a fresh `sluice serve` on a temporary directory.
    #[arg(long)]
    server: Option<String>,
    /// Concurrent clients, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    clients: Vec<usize>,
    /// Length of each run.
    #[arg(long, default_value_t = 5)]
    duration_s: u64,
    /// Size of each task's payload.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Submit(args) => submit(args).await,
    }
}

/// A `sluice serve` child on a temporary directory, stopped when dropped.
struct ChildServer {
    child: Child,
    url: String,
    _data_dir: tempfile::TempDir,
}

impl ChildServer {
    fn start() -> anyhow::Result<ChildServer> {
        let data_dir = tempfile::tempdir().context("cannot create a temporary data directory")?;
        let exe = std::env::current_exe().context("cannot find the sluice executable")?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .env("SLUICE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start sluice serve")?;
        let stdout = child.stdout.take().context("no stdout from sluice serve")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(url) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            bail!(
                "sluice serve did not announce its address (got `{}`)",
                line.trim()
            );
        };
        Ok(ChildServer {
            url: url.to_owned(),
            child,
            _data_dir: data_dir,
        })
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

struct RunFigures {
    acknowledged: usize,
    failed: usize,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

async fn submit(args: SubmitBenchArgs) -> anyhow::Result<()> {
    if args.clients.iter().any(|&c| c == 0 || c > 4096) {
        bail!("--clients values must be 1 to 4096");
    }
    if args.duration_s == 0 || args.duration_s > 600 {
        bail!("--duration-s must be 1 to 600");
    }
    let child = match &args.server {
        Some(_) => None,
        None => Some(tokio::task::spawn_blocking(ChildServer::start).await??),
    };
    let url = match (&args.server, &child) {
        (Some(url), _) => url.clone(),
        (None, Some(child)) => child.url.clone(),
        (None, None) => unreachable!("a child is started when no server is given"),
    };
    println!(
        "durable submissions over HTTP to {url}, {} s per run, {} B payloads",
        args.duration_s, args.payload_bytes
    );
    println!(
        "{:>8} {:>14} {:>10} {:>10} {:>8}",
        "clients", "submissions/s", "p50_ms", "p99_ms", "errors"
    );
    let payload = Arc::new("x".repeat(args.payload_bytes));
    for (run, &clients) in args.clients.iter().enumerate() {
        let figures = one_run(
            &url,
            run,
            clients,
            Duration::from_secs(args.duration_s),
            &payload,
        )
        .await?;
        let mut latencies = figures.latencies_us;
        latencies.sort_unstable();
        let rate = figures.acknowledged as f64 / figures.elapsed.as_secs_f64();
        println!(
            "{:>8} {:>14.0} {:>10.2} {:>10.2} {:>8}",
            clients,
            rate,
            percentile_ms(&latencies, 0.50),
            percentile_ms(&latencies, 0.99),
            figures.failed
        );
    }
    drop(child);
    Ok(())
}

async fn one_run(
    url: &str,
    run: usize,
    clients: usize,
    duration: Duration,
    payload: &Arc<String>,
) -> anyhow::Result<RunFigures> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .timeout(Duration::from_secs(30))
        .build()?;
    let endpoint = format!("{url}/v1/tasks");
    let nonce = std::process::id();
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = tokio::task::JoinSet::new();
    for client in 0..clients {
        let http = http.clone();
        let endpoint = endpoint.clone();
        let payload = payload.clone();
        workers.spawn(async move {
            let mut latencies_us = Vec::new();
            let mut failed = 0;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let body = format!(
                    r#"{{"kind":"bench.submit","key":"bench-{nonce}-{run}-{client}-{n}","device":"bench-{client}","payload":"{payload}"}}"#
                );
                n += 1;
                let sent = Instant::now();
                let answer = http
                    .post(&endpoint)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                match answer {
                    Ok(response) if response.status() == reqwest::StatusCode::CREATED => {
                        let _ = response.bytes().await;
                        latencies_us.push(sent.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    }
                    _ => failed += 1,
                }
            }
            (latencies_us, failed)
        });
    }
    let mut figures = RunFigures {
        acknowledged: 0,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    while let Some(joined) = workers.join_next().await {
        let (latencies, failed) = joined?;
        figures.acknowledged += latencies.len();
        figures.failed += failed;
        figures.latencies_us.extend(latencies);
    }
    figures.elapsed = started.elapsed();
    Ok(figures)
}

fn percentile_ms(sorted_us: &[u32], quantile: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted_us.len() as f64 - 1.0) * quantile).round() as usize;
    f64::from(sorted_us[index.min(sorted_us.len() - 1)]) / 1000.0
}
