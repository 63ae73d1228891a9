//! `sluice bench submit`: durable submissions per second over real HTTP, and the latency from
//! request to acknowledgement, at several numbers of concurrent clients.

use super::child::ChildServer;
use anyhow::{Context, bail};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

struct RunFigures {
    acknowledged: usize,
    failed: usize,
    elapsed: Duration,
    latencies_us: Vec<u32>,
}

pub async fn run(args: SubmitBenchArgs) -> anyhow::Result<()> {
    if args.clients.iter().any(|&c| c == 0 || c > 4096) {
        bail!("--clients values must be 1 to 4096");
    }
    if args.duration_s == 0 || args.duration_s > 600 {
        bail!("--duration-s must be 1 to 600");
    }
    let (url, child) = match &args.server {
        Some(url) => (url.clone(), None),
        None => {
            let child = tokio::task::spawn_blocking(ChildServer::start_fresh).await??;
            (child.url.clone(), Some(child))
        }
    };
    outln!(
        "durable submissions over HTTP to {url}, {} s per run, {} B payloads",
        args.duration_s,
        args.payload_bytes
    )?;
    outln!(
        "{:>8} {:>14} {:>10} {:>10} {:>8}",
        "clients",
        "submissions/s",
        "p50_ms",
        "p99_ms",
        "errors"
    )?;
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
        outln!(
            "{:>8} {:>14.0} {:>10.2} {:>10.2} {:>8}",
            clients,
            rate,
            percentile_ms(&latencies, 0.50),
            percentile_ms(&latencies, 0.99),
            figures.failed
        )?;
    }
    drop(child);
    Ok(())
}

/// One virtual client: its own keep-alive HTTP/1.1 connection, one request at a time, as a
/// device would send. A bare hyper connection keeps the client's CPU cost low, since it shares
/// the machine with the server being measured.
async fn client_loop(
    address: std::net::SocketAddr,
    authority: String,
    deadline: Instant,
    body_of: impl Fn(u64) -> String,
) -> anyhow::Result<(Vec<u32>, usize)> {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut latencies_us = Vec::new();
    let mut failed = 0;
    let mut n = 0u64;
    while Instant::now() < deadline {
        let request = hyper::Request::post("/v1/tasks")
            .header("host", &authority)
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body_of(n))))?;
        n += 1;
        let sent = Instant::now();
        match sender.send_request(request).await {
            Ok(response) => {
                let created = response.status() == hyper::StatusCode::CREATED;
                let read = response.into_body().collect().await;
                if created && read.is_ok() {
                    latencies_us.push(sent.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                } else {
                    failed += 1;
                }
            }
            Err(_) => {
                failed += 1;
                break;
            }
        }
    }
    Ok((latencies_us, failed))
}

async fn one_run(
    url: &str,
    run: usize,
    clients: usize,
    duration: Duration,
    payload: &Arc<String>,
) -> anyhow::Result<RunFigures> {
    let parsed = url::Url::parse(url).context("the server URL")?;
    let authority = match (parsed.host_str(), parsed.port_or_known_default()) {
        (Some(host), Some(port)) => format!("{host}:{port}"),
        _ => bail!("the server URL needs a host and port"),
    };
    let address = tokio::net::lookup_host(&authority)
        .await?
        .next()
        .with_context(|| format!("cannot resolve {authority}"))?;
    let nonce = std::process::id();
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = tokio::task::JoinSet::new();
    for client in 0..clients {
        let (payload, authority) = (payload.clone(), authority.clone());
        workers.spawn(client_loop(address, authority, deadline, move |n| {
            format!(
                r#"{{"kind":"bench.submit","key":"bench-{nonce}-{run}-{client}-{n}","device":"bench-{client}","payload":"{payload}"}}"#
            )
        }));
    }
    let mut figures = RunFigures {
        acknowledged: 0,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies_us: Vec::new(),
    };
    while let Some(joined) = workers.join_next().await {
        let (latencies, failed) = joined??;
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
