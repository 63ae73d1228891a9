//! What the demo submits and when: a morning batch of OCT exams at once (a backlog, so the
//! buckets' weights and aging show), then OCT exams and vector searches at a steady pace.

use anyhow::Context;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice::vector::Vectors;
use sluice_client::Client;
use sluice_model::{Priority, TaskSpec};
use std::time::{Duration, Instant};

/// One submission of the plan.
#[derive(Clone, Debug)]
pub enum Item {
    Oct { priority: Priority, site: u32 },
    Search { vector: Vec<f32> },
}

/// What was submitted: its task id and what it was.
pub struct SubmittedItem {
    pub id: String,
    pub item: Item,
}

pub struct Plan {
    /// Submitted at once, at the start.
    batch: Vec<Item>,
    /// Submitted one by one, evenly over the pace the caller gives.
    paced: Vec<Item>,
}

pub const SEARCH_K: u32 = 10;
/// The vector collection the demo's shard workers hold and its searches name.
pub const COLLECTION: &str = "demo";

impl Plan {
    pub fn new(tasks: usize, searches: usize, vectors: &Vectors, seed: u64) -> Plan {
        let mut random = SmallRng::seed_from_u64(seed);
        let oct = |random: &mut SmallRng| {
            let roll: f64 = random.random();
            let priority = if roll < 0.15 {
                Priority::Urgent
            } else if roll < 0.65 {
                Priority::Normal
            } else {
                Priority::Low
            };
            Item::Oct {
                priority,
                site: random.random_range(0..5),
            }
        };
        let batch: Vec<Item> = (0..tasks / 2).map(|_| oct(&mut random)).collect();
        let mut paced: Vec<Item> = (tasks / 2..tasks).map(|_| oct(&mut random)).collect();
        for _ in 0..searches {
            let row = random.random_range(0..vectors.len());
            let vector = vectors
                .row(row)
                .iter()
                .map(|x| x + random.random_range(-0.3..0.3))
                .collect();
            let at = random.random_range(0..=paced.len());
            paced.insert(at, Item::Search { vector });
        }
        Plan { batch, paced }
    }

    pub fn len(&self) -> usize {
        self.batch.len() + self.paced.len()
    }

    pub fn searches(&self) -> usize {
        self.paced
            .iter()
            .filter(|item| matches!(item, Item::Search { .. }))
            .count()
    }
}

fn spec(item: &Item, number: usize) -> anyhow::Result<TaskSpec> {
    let body = match item {
        Item::Oct { priority, site } => serde_json::json!({
            "kind": "oct.analyze",
            "priority": priority,
            "device": format!("scanner-{site}-{}", number % 3),
            "tenant": format!("site-{site}"),
            "est_exec_ms": 2_000,
            "max_attempts": 4,
            "resources": {"gpu_memory_mb": 8_000},
            "payload": {"exam": number, "eye": if number % 2 == 0 { "left" } else { "right" }},
        }),
        Item::Search { vector } => serde_json::json!({
            "kind": "vector.search",
            "priority": "urgent",
            "device": "search-frontend",
            "tenant": "search",
            "est_exec_ms": 500,
            "payload": {"vector": vector, "k": SEARCH_K, "collection": COLLECTION},
        }),
    };
    serde_json::from_value(body).context("a demo task")
}

/// Submits the batch at once, then the rest at a steady pace.
pub async fn submit_all(
    client: Client,
    plan: Plan,
    pace: Duration,
) -> anyhow::Result<Vec<SubmittedItem>> {
    let mut submitted = Vec::with_capacity(plan.len());
    let mut batch = tokio::task::JoinSet::new();
    for (number, item) in plan.batch.iter().enumerate() {
        let (client, item, spec) = (client.clone(), item.clone(), spec(item, number)?);
        batch.spawn(async move { (item, client.submit(&spec).await) });
    }
    while let Some(joined) = batch.join_next().await {
        let (item, answer) = joined?;
        submitted.push(SubmittedItem {
            id: answer?.task.id.to_string(),
            item,
        });
    }
    let started = Instant::now();
    let step = pace / plan.paced.len().max(1) as u32;
    for (offset, item) in plan.paced.iter().enumerate() {
        tokio::time::sleep_until((started + step * offset as u32).into()).await;
        let answer = client
            .submit(&spec(item, plan.batch.len() + offset)?)
            .await?;
        submitted.push(SubmittedItem {
            id: answer.task.id.to_string(),
            item: item.clone(),
        });
    }
    Ok(submitted)
}
