//! The demo's live progress line and its closing summary: what completed, retries, waits per
//! bucket, the vector searches' recall against exact search and their latency, and where to
//! look next.

use super::load::{Item, SEARCH_K, SubmittedItem};
use anyhow::{Context, bail};
use serde_json::Value;
use sluice::vector::{Vectors, brute_force};
use sluice_client::Client;
use sluice_model::{Metric, Priority};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TERMINAL: [&str; 5] = ["completed", "failed", "dead", "cancelled", "timed_out"];
/// The demo gives up if the load has not finished by then.
const GIVE_UP: Duration = Duration::from_secs(180);

fn count(stats: &Value, state: &str) -> u64 {
    stats["tasks_by_state"][state].as_u64().unwrap_or(0)
}

/// Prints a line of progress every second until `expected` tasks (children included) have
/// ended and the submitter is done.
pub async fn watch_until_done(
    client: &Client,
    expected: u64,
    submitting: &tokio::task::JoinHandle<anyhow::Result<Vec<SubmittedItem>>>,
    started: Instant,
) -> anyhow::Result<()> {
    outln!(
        "{:>6}  {:>22}  {:>7}  {:>5}  {:>11}  {:>7}",
        "time",
        "queued urgent/norm/low",
        "running",
        "split",
        "ended",
        "backoff"
    )?;
    loop {
        let stats = client.stats().await?;
        let queued = &stats["queued_by_bucket"];
        let ended: u64 = TERMINAL.iter().map(|s| count(&stats, s)).sum();
        outln!(
            "{:>5.1}s  {:>22}  {:>7}  {:>5}  {:>11}  {:>7}",
            started.elapsed().as_secs_f64(),
            format!(
                "{}/{}/{}",
                queued["urgent"].as_u64().unwrap_or(0),
                queued["normal"].as_u64().unwrap_or(0),
                queued["low"].as_u64().unwrap_or(0)
            ),
            count(&stats, "claimed") + count(&stats, "running"),
            count(&stats, "split"),
            format!("{ended}/{expected}"),
            count(&stats, "retry_wait"),
        )?;
        if ended >= expected && submitting.is_finished() {
            return Ok(());
        }
        if started.elapsed() > GIVE_UP {
            bail!("the load did not finish within {} s", GIVE_UP.as_secs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// p50 and p99 of `values` (nearest rank), or None when empty.
fn percentiles(values: &mut [u64]) -> Option<(u64, u64)> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let rank =
        |p: f64| values[((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1];
    Some((rank(0.50), rank(0.99)))
}

#[derive(Default)]
pub struct Summary {
    elapsed: Duration,
    by_state: BTreeMap<String, u64>,
    retries: u64,
    waits_ms: BTreeMap<Priority, Vec<u64>>,
    searches: usize,
    search_latency_ms: Vec<u64>,
    recall_hits: usize,
    recall_total: usize,
    partial: usize,
    breaker_opens: usize,
    promotions: u64,
}

impl Summary {
    pub async fn gather(
        client: &Client,
        submitted: Vec<SubmittedItem>,
        vectors: &Vectors,
        elapsed: Duration,
    ) -> anyhow::Result<Summary> {
        let mut report = Summary {
            elapsed,
            ..Summary::default()
        };
        // Read tasks and timelines 32 at a time.
        for chunk in submitted.chunks(32) {
            let mut reads = tokio::task::JoinSet::new();
            for entry in chunk {
                let (client, id) = (client.clone(), entry.id.clone());
                reads.spawn(async move {
                    let task = client.task(&id).await?;
                    let events = client.events(&id).await?;
                    anyhow::Ok((id, task, events))
                });
            }
            let mut read = BTreeMap::new();
            while let Some(joined) = reads.join_next().await {
                let (id, task, events) = joined??;
                read.insert(id, (task, events));
            }
            for entry in chunk {
                let (task, events) = read.get(&entry.id).context("a task read went missing")?;
                report.learn(entry, task, events, vectors);
            }
        }
        let log = client.worker_events(0).await?;
        report.breaker_opens = log["events"].as_array().map_or(0, |events| {
            events.iter().filter(|e| e["to"] == "open").count()
        });
        Ok(report)
    }

    fn learn(&mut self, entry: &SubmittedItem, task: &Value, events: &Value, vectors: &Vectors) {
        let state = task["state"].as_str().unwrap_or("unknown").to_owned();
        *self.by_state.entry(state.clone()).or_default() += 1;
        let created = task["created_at_ms"].as_u64().unwrap_or(0);
        let events = events["events"].as_array().cloned().unwrap_or_default();
        self.retries += events.iter().filter(|e| e["to"] == "retry_wait").count() as u64;
        self.promotions += events
            .iter()
            .filter(|e| {
                e["from"] == "queued"
                    && e["to"] == "queued"
                    && e["detail"].as_str().is_some_and(|d| d.contains("promoted"))
            })
            .count() as u64;
        match &entry.item {
            Item::Oct { priority, .. } => {
                let claimed = events
                    .iter()
                    .find(|e| e["to"] == "claimed")
                    .and_then(|e| e["at_ms"].as_u64());
                if let Some(at) = claimed {
                    self.waits_ms
                        .entry(*priority)
                        .or_default()
                        .push(at.saturating_sub(created));
                }
            }
            Item::Search { vector } => {
                self.searches += 1;
                if state != "completed" {
                    return;
                }
                let ended = task["updated_at_ms"].as_u64().unwrap_or(created);
                self.search_latency_ms.push(ended.saturating_sub(created));
                let result = &task["result"];
                if result["partial"] == true {
                    self.partial += 1;
                }
                let exact: Vec<u64> = brute_force(vectors, vector, SEARCH_K as usize, Metric::L2)
                    .iter()
                    .map(|h| h.id)
                    .collect();
                let found = result["hits"].as_array().map_or(0, |hits| {
                    hits.iter()
                        .filter_map(|h| h["id"].as_u64())
                        .filter(|id| exact.contains(id))
                        .count()
                });
                self.recall_hits += found;
                self.recall_total += exact.len();
            }
        }
    }

    pub fn print(&self, url: &str) -> Result<(), crate::cli::output::StdoutError> {
        outln!("\n== Summary ({:.1} s) ==", self.elapsed.as_secs_f64())?;
        let states: Vec<String> = self
            .by_state
            .iter()
            .map(|(state, n)| format!("{state} {n}"))
            .collect();
        outln!("tasks submitted: {}", states.join(", "))?;
        outln!(
            "retries: {} (backoff with jitter); circuit breakers opened: {}",
            self.retries,
            self.breaker_opens
        )?;
        outln!(
            "promotions by aging: {} (this demo ages low → normal after 8 s, normal → urgent after 12 s)",
            self.promotions
        )?;
        outln!("wait from submit to claim, OCT exams, by submitted priority:")?;
        for priority in Priority::ALL {
            let mut waits = self.waits_ms.get(&priority).cloned().unwrap_or_default();
            match percentiles(&mut waits) {
                Some((p50, p99)) => outln!(
                    "  {:<7} p50 {p50:>6} ms   p99 {p99:>6} ms   ({} tasks)",
                    priority.as_str(),
                    waits.len()
                ),
                None => outln!("  {:<7} no tasks", priority.as_str()),
            }?;
        }
        let recall = if self.recall_total == 0 {
            0.0
        } else {
            self.recall_hits as f64 / self.recall_total as f64
        };
        let mut latency = self.search_latency_ms.clone();
        let (p50, p99) = percentiles(&mut latency).unwrap_or((0, 0));
        outln!(
            "vector searches: {} split into shards and merged; recall@{SEARCH_K} against exact search {recall:.3}; \
             {} partial; latency p50 {p50} ms, p99 {p99} ms",
            self.searches,
            self.partial
        )?;
        outln!("\nWhere to look next:")?;
        outln!("  curl {url}/v1/stats                  counts by state and bucket")?;
        outln!("  curl {url}/v1/workers                workers, health, breakers")?;
        outln!(
            "  curl {url}/v1/collections            vector collections, shards and their workers"
        )?;
        outln!("  curl '{url}/v1/tasks?state=dead'     what gave up, and why")?;
        outln!("  curl {url}/v1/policies               active policy versions")?;
        outln!(
            "  sluice policy upload merge --builtin merge-threshold --config max_distance=40   swap the merge live"
        )?;
        outln!("  (this server stops with the demo; `sluice serve` runs one that stays)")
    }
}
