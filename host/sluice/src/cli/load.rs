//! `sluice load`: a steady, open-loop submission load against a running server, for driving a
//! live experiment or a rollout in one command. Task n is due at `n / rate` seconds; each is
//! sent when due (at most `max_in_flight` unanswered at once), and its acknowledgement latency
//! is counted from when it was due, so a server that falls behind shows in the figures instead
//! of slowing the load down unseen.

use super::tasks::ServerArg;
use anyhow::bail;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_client::ClientError;
use sluice_model::{Priority, Resources, TaskSpec};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, Semaphore};

/// The most tasks one run submits: rate × duration past it is refused, which bounds the
/// latency samples kept (4 bytes each).
const MAX_TASKS: u64 = 10_000_000;

#[derive(clap::Args)]
pub struct LoadArgs {
    #[command(flatten)]
    server: ServerArg,
    /// Tasks submitted per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// How long to submit for, in seconds.
    #[arg(
        long = "duration-s",
        visible_alias = "duration",
        default_value_t = 10.0
    )]
    duration_s: f64,
    /// Each priority's share of the tasks: weights, scaled to add up to 1; a priority left out
    /// gets none.
    #[arg(long, value_parser = parse_mix, default_value = "urgent=0.2,normal=0.5,low=0.3")]
    mix: Mix,
    /// Devices the tasks come from (`load-device-N`), each of one tenant.
    #[arg(long, default_value_t = 20)]
    devices: u32,
    /// Tenants (sites) the devices belong to (`load-site-N`).
    #[arg(long, default_value_t = 3)]
    tenants: u32,
    /// The tasks' kind; repeatable, each task takes one of them at random.
    #[arg(long = "kind", default_value = "oct.analyze")]
    kinds: Vec<String>,
    /// The tasks' estimated execution time.
    #[arg(long, default_value_t = 1_000)]
    est_exec_ms: u64,
    /// A label every task carries, k=v; repeatable.
    #[arg(long = "label", value_parser = super::tasks::parse_label)]
    labels: Vec<(String, String)>,
    /// Submissions sent and not yet answered, at most.
    #[arg(long, default_value_t = 512)]
    max_in_flight: u32,
    /// Seeds the choice of priority, device and kind, so two runs send the same tasks.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// The priorities' cumulative shares, urgent, normal, low.
#[derive(Clone, Copy, Debug)]
pub struct Mix([f64; 3]);

fn parse_mix(text: &str) -> Result<Mix, String> {
    let mut shares = [0.0; 3];
    let mut named = [false; 3];
    for part in text.split(',') {
        let Some((name, share)) = part.split_once('=') else {
            return Err(format!("`{part}` is not NAME=SHARE (e.g. urgent=0.2)"));
        };
        let index = super::tasks::parse_priority(name.trim())?.index();
        if std::mem::replace(&mut named[index], true) {
            return Err(format!("{} is named twice", name.trim()));
        }
        let share: f64 = share
            .trim()
            .parse()
            .map_err(|_| format!("`{share}` is not a number"))?;
        if !share.is_finite() || share < 0.0 {
            return Err(format!("the share of {name} must be 0 or more"));
        }
        shares[index] = share;
    }
    let total: f64 = shares.iter().sum();
    if total <= 0.0 {
        return Err("the shares add up to 0: give at least one priority a share".into());
    }
    Ok(Mix([
        shares[0] / total,
        (shares[0] + shares[1]) / total,
        1.0,
    ]))
}

impl Mix {
    fn pick(&self, roll: f64) -> Priority {
        if roll < self.0[0] {
            Priority::Urgent
        } else if roll < self.0[1] {
            Priority::Normal
        } else {
            Priority::Low
        }
    }
}

/// What came back, shared by the submissions in flight.
#[derive(Default)]
struct Tally {
    acknowledged: AtomicU64,
    refused: AtomicU64,
    unanswered: AtomicU64,
    /// Acknowledgement latencies in µs, from each task's due time.
    latency_us: Mutex<Vec<u32>>,
    /// The first refusal's and the first transport error's text, for the summary.
    first_error: Mutex<Option<String>>,
}

pub async fn run(args: LoadArgs) -> anyhow::Result<()> {
    if !(args.rate.is_finite() && args.rate > 0.0 && args.rate <= 1_000_000.0) {
        bail!("--rate must be more than 0 and at most 1000000 tasks a second");
    }
    if !(args.duration_s.is_finite() && args.duration_s > 0.0) {
        bail!("--duration-s must be more than 0");
    }
    let total = (args.rate * args.duration_s).round() as u64;
    if total > MAX_TASKS {
        bail!("--rate × --duration-s is {total} tasks; one run sends at most {MAX_TASKS}");
    }
    if args.devices == 0 || args.tenants == 0 || args.max_in_flight == 0 {
        bail!("--devices, --tenants and --max-in-flight must be at least 1");
    }
    if args.kinds.iter().any(|k| k.is_empty()) {
        bail!("--kind must not be empty");
    }
    let client = args.server.client_with_pool(args.max_in_flight as usize)?;
    let tally = Arc::new(Tally::default());
    let slots = Arc::new(Semaphore::new(args.max_in_flight as usize));
    let labels: BTreeMap<String, String> = args.labels.iter().cloned().collect();
    let mut random = SmallRng::seed_from_u64(args.seed);
    let mut by_priority = [0u64; 3];
    let started = Instant::now();
    let mut next_report = Duration::from_secs(1);
    let mut late_waits = 0u64;
    for n in 0..total {
        let due = started + Duration::from_secs_f64(n as f64 / args.rate);
        tokio::time::sleep_until(due.into()).await;
        let permit = match slots.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // Every slot is waiting on the server: this task goes late, and is counted so.
                late_waits += 1;
                slots.clone().acquire_owned().await?
            }
        };
        let task = spec(&args, &labels, &mut random, &mut by_priority);
        spawn_one(&client, &tally, permit, due, task);
        let elapsed = started.elapsed();
        if elapsed >= next_report {
            outln!(
                "{:>5.1} s  sent {:>8}  acknowledged {:>8}  refused {:>5}  unanswered {:>5}",
                elapsed.as_secs_f64(),
                n + 1,
                tally.acknowledged.load(Ordering::Relaxed),
                tally.refused.load(Ordering::Relaxed),
                tally.unanswered.load(Ordering::Relaxed)
            )?;
            next_report += Duration::from_secs(1);
        }
    }
    let sending = started.elapsed();
    // Every answer in: all the slots back.
    let _all = slots.acquire_many(args.max_in_flight).await?;
    let answered = started.elapsed();
    summary(
        &args,
        &tally,
        total,
        sending,
        answered,
        by_priority,
        late_waits,
    )
    .await
}

fn spec(
    args: &LoadArgs,
    labels: &BTreeMap<String, String>,
    random: &mut SmallRng,
    by_priority: &mut [u64; 3],
) -> TaskSpec {
    let priority = args.mix.pick(random.random());
    by_priority[priority.index()] += 1;
    let device = random.random_range(0..args.devices);
    let kind = &args.kinds[random.random_range(0..args.kinds.len())];
    TaskSpec {
        key: None,
        kind: kind.clone(),
        priority,
        device: format!("load-device-{device}"),
        tenant: format!("load-site-{}", device % args.tenants),
        labels: labels.clone(),
        est_exec_ms: args.est_exec_ms,
        deadline_ms: None,
        max_attempts: 3,
        payload: serde_json::Value::Null,
        callback_url: None,
        resources: Resources::default(),
        concurrency_key: None,
        preemptible: true,
    }
}

fn spawn_one(
    client: &sluice_client::Client,
    tally: &Arc<Tally>,
    permit: tokio::sync::OwnedSemaphorePermit,
    due: Instant,
    spec: TaskSpec,
) {
    let client = client.clone();
    let tally = tally.clone();
    tokio::spawn(async move {
        let answer = client.submit(&spec).await;
        let latency_us = due.elapsed().as_micros().min(u32::MAX as u128) as u32;
        match answer {
            Ok(_) => {
                tally.acknowledged.fetch_add(1, Ordering::Relaxed);
                tally.latency_us.lock().await.push(latency_us);
            }
            Err(error) => {
                let counter = match error {
                    ClientError::Problem { .. } => &tally.refused,
                    _ => &tally.unanswered,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tally
                    .first_error
                    .lock()
                    .await
                    .get_or_insert_with(|| error.to_string());
            }
        }
        drop(permit);
    });
}

async fn summary(
    args: &LoadArgs,
    tally: &Tally,
    total: u64,
    sending: Duration,
    answered: Duration,
    by_priority: [u64; 3],
    late_waits: u64,
) -> anyhow::Result<()> {
    let acknowledged = tally.acknowledged.load(Ordering::Relaxed);
    let mut latency = std::mem::take(&mut *tally.latency_us.lock().await);
    latency.sort_unstable();
    let at = |q: f64| -> f64 {
        let index = ((latency.len() - 1) as f64 * q).round() as usize;
        latency[index] as f64 / 1000.0
    };
    outln!()?;
    // The last task was due one interval before the load's end: that interval counts.
    let span_s = sending.as_secs_f64() + 1.0 / args.rate;
    outln!(
        "sent {total} tasks in {span_s:.2} s: {:.1} a second (asked {:.1}); the last answer or error after {:.2} s",
        total as f64 / span_s,
        args.rate,
        answered.as_secs_f64()
    )?;
    outln!(
        "acknowledged {acknowledged}, refused {}, unanswered {}; by priority: urgent {}, normal {}, low {}",
        tally.refused.load(Ordering::Relaxed),
        tally.unanswered.load(Ordering::Relaxed),
        by_priority[0],
        by_priority[1],
        by_priority[2]
    )?;
    if latency.is_empty() {
        outln!("acknowledgement latency: none acknowledged")?;
    } else {
        outln!(
            "acknowledgement latency from each task's due time: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            at(0.5),
            at(0.99),
            at(1.0)
        )?;
    }
    if late_waits > 0 {
        outln!(
            "behind: {late_waits} tasks waited for one of the {} submissions in flight to be answered (raise --max-in-flight, or the server is saturated)",
            args.max_in_flight
        )?;
    }
    if let Some(error) = tally.first_error.lock().await.as_ref() {
        outln!("first error: {error}")?;
    }
    if acknowledged == 0 {
        bail!("no submission was acknowledged");
    }
    Ok(())
}
