//! `sluice bench skip-locked`: the baseline the PostgreSQL store is measured against — a plain
//! table queue on the same server, claimed with `SELECT ... FOR UPDATE SKIP LOCKED` as River,
//! Oban and graphile-worker do, driven in the shape of `bench e2e` (submitters inserting
//! batches of 100, workers claiming up to `--claim-batch` with the jobs' payloads and
//! completing each batch in one statement), every step a committed, durable transaction. No
//! engine, no events, and no HTTP unless `--http` puts the same statements behind it
//! (`skip_locked_http`): what the database alone gives a queue.

use super::skip_locked_http;
use anyhow::{Context, bail};
use sluice_store_postgres::{drop_scratch_database, redacted, scratch_database};
use sqlx::postgres::{PgPool, PgPoolOptions};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct SkipLockedBenchArgs {
    /// A postgres:// URL of the server to measure: a database is created on it for the run
    /// and dropped after.
    #[arg(long)]
    store: String,
    /// Jobs to push through.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// Concurrent workers, one connection each.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Jobs one claim takes at most.
    #[arg(long, default_value_t = 32)]
    claim_batch: usize,
    /// Concurrent submitters, each inserting batches of 100 jobs in one statement.
    #[arg(long, default_value_t = 4)]
    submitters: usize,
    /// Insert every job first, then start the workers: measures claim → complete alone.
    #[arg(long)]
    prefill: bool,
    /// Put the queue behind a minimal HTTP server (axum and JSON, in this process, the same
    /// three statements behind three routes) and drive it over HTTP: what HTTP alone costs the
    /// plain queue on this machine.
    #[arg(long)]
    http: bool,
}

/// How long a worker that found the queue empty waits before it asks again.
const EMPTY_POLL_MS: u64 = 2;
const SUBMIT_BATCH: usize = 100;

const SCHEMA: &str = "CREATE TABLE jobs ( \
     id bigserial PRIMARY KEY, \
     kind text NOT NULL, \
     priority smallint NOT NULL, \
     idempotency_key text NOT NULL UNIQUE, \
     payload jsonb NOT NULL, \
     state smallint NOT NULL DEFAULT 0, \
     attempts integer NOT NULL DEFAULT 0, \
     locked_until timestamptz, \
     created_at timestamptz NOT NULL DEFAULT now(), \
     finished_at timestamptz); \
     CREATE INDEX jobs_ready ON jobs (priority, id) WHERE state = 0";

pub async fn run(args: SkipLockedBenchArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.tasks > 10_000_000 {
        bail!("--tasks must be 1 to 10000000");
    }
    if !(1..=256).contains(&args.workers) || !(1..=1024).contains(&args.claim_batch) {
        bail!("--workers must be 1 to 256 and --claim-batch 1 to 1024");
    }
    if !(1..=64).contains(&args.submitters) {
        bail!("--submitters must be 1 to 64");
    }
    let server = args.store.clone();
    let database = tokio::task::spawn_blocking(move || scratch_database(&server, "sluice_queue"))
        .await?
        .context("cannot create the bench's database")?;
    let measured = measure(&args, &database).await;
    let dropped = tokio::task::spawn_blocking(move || drop_scratch_database(&database)).await?;
    let figures = measured?;
    dropped.context("cannot drop the bench's database")?;
    outln!(
        "plain SKIP LOCKED queue on {}{}: {} jobs, {} workers claiming up to {} each, {} submitters",
        redacted(&args.store),
        if args.http { ", behind HTTP" } else { "" },
        args.tasks,
        args.workers,
        args.claim_batch,
        args.submitters
    )?;
    let what = if args.prefill {
        "claim → complete, after all were inserted"
    } else {
        "insert → claim → complete"
    };
    outln!(
        "jobs/s {:.0} ({what}, every step a committed transaction); all inserted after {:.2} s, all complete {:.2} s after the start; {} claims, {} came back empty",
        args.tasks as f64 / figures.elapsed.as_secs_f64(),
        figures.inserted_after.as_secs_f64(),
        figures.elapsed.as_secs_f64(),
        figures.claims,
        figures.empty_claims
    )?;
    Ok(())
}

struct Figures {
    inserted_after: Duration,
    elapsed: Duration,
    claims: usize,
    empty_claims: usize,
}

async fn measure(args: &SkipLockedBenchArgs, database: &str) -> anyhow::Result<Figures> {
    let pool = PgPoolOptions::new()
        .max_connections((args.workers + args.submitters) as u32)
        .connect(database)
        .await
        .context("cannot connect to the bench's database")?;
    sqlx::raw_sql(SCHEMA).execute(&pool).await?;
    let (queue, server) = if args.http {
        let (queue, server) = skip_locked_http::serve(pool.clone()).await?;
        (queue, Some(server))
    } else {
        (Queue::Direct(pool.clone()), None)
    };
    let done = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    let start_workers = |workers: &mut tokio::task::JoinSet<_>| {
        for _ in 0..args.workers {
            let (queue, done) = (queue.clone(), done.clone());
            let (total, batch) = (args.tasks, args.claim_batch);
            workers.spawn(async move { worker(queue, batch, total, done).await });
        }
    };
    if !args.prefill {
        start_workers(&mut workers);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    for _ in 0..args.submitters {
        let (queue, next, total) = (queue.clone(), next.clone(), args.tasks);
        submitters.spawn(async move { submit(queue, next, total).await });
    }
    while let Some(joined) = submitters.join_next().await {
        joined??;
    }
    let inserted_after = started.elapsed();
    let started = if args.prefill {
        start_workers(&mut workers);
        Instant::now()
    } else {
        started
    };
    let (mut claims, mut empty_claims) = (0, 0);
    while let Some(joined) = workers.join_next().await {
        let (full, empty) = joined??;
        claims += full + empty;
        empty_claims += empty;
    }
    let elapsed = started.elapsed();
    if let Some(server) = server {
        server.abort();
    }
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE state <> 2")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    if left != 0 {
        bail!("{left} jobs were not completed");
    }
    Ok(Figures {
        inserted_after,
        elapsed,
        claims,
        empty_claims,
    })
}

/// Where the bench's clients send their statements: the pool, or the HTTP server in front
/// of it.
#[derive(Clone)]
pub(super) enum Queue {
    Direct(PgPool),
    Http {
        client: reqwest::Client,
        url: String,
    },
}

impl Queue {
    async fn insert(&self, numbers: Vec<i64>) -> anyhow::Result<()> {
        match self {
            Queue::Direct(pool) => insert(pool, &numbers).await,
            Queue::Http { client, url } => post(client, url, "jobs", &numbers).await.map(drop),
        }
    }

    async fn claim(&self, batch: usize) -> anyhow::Result<Vec<ClaimedJob>> {
        match self {
            Queue::Direct(pool) => claim(pool, batch).await,
            Queue::Http { client, url } => {
                Ok(post(client, url, "claim", &batch).await?.json().await?)
            }
        }
    }

    async fn complete(&self, ids: Vec<i64>) -> anyhow::Result<u64> {
        match self {
            Queue::Direct(pool) => complete(pool, &ids).await,
            Queue::Http { client, url } => {
                Ok(post(client, url, "complete", &ids).await?.json().await?)
            }
        }
    }
}

/// Posts `body` as JSON to the queue's `route`: the answer, once it is a success.
async fn post(
    client: &reqwest::Client,
    url: &str,
    route: &str,
    body: &impl serde::Serialize,
) -> anyhow::Result<reqwest::Response> {
    let answer = client
        .post(format!("{url}/{route}"))
        .json(body)
        .send()
        .await?;
    let status = answer.status();
    if status.is_success() {
        return Ok(answer);
    }
    let text = answer.text().await.unwrap_or_default();
    bail!("the queue's /{route} answered {status}: {text}")
}

/// A claimed job as a worker needs it.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ClaimedJob {
    pub id: i64,
    pub payload: serde_json::Value,
}

/// Inserts jobs `numbers` in one statement: the same three priorities, keys and payloads as
/// `bench e2e`'s tasks.
pub(super) async fn insert(pool: &PgPool, numbers: &[i64]) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO jobs (kind, priority, idempotency_key, payload) \
         SELECT 'bench.e2e', n % 3, 'e2e-' || n, jsonb_build_object('n', n) \
         FROM UNNEST($1::int8[]) AS n",
    )
    .bind(numbers)
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes up to `batch` ready jobs, most urgent first, with their payloads.
pub(super) async fn claim(pool: &PgPool, batch: usize) -> anyhow::Result<Vec<ClaimedJob>> {
    let rows: Vec<(i64, serde_json::Value)> = sqlx::query_as(
        "UPDATE jobs SET state = 1, attempts = attempts + 1, \
         locked_until = now() + interval '30 seconds' \
         WHERE id IN (SELECT id FROM jobs WHERE state = 0 ORDER BY priority, id \
         LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id, payload",
    )
    .bind(batch as i64)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, payload)| ClaimedJob { id, payload })
        .collect())
}

/// Completes the claimed jobs `ids`; how many were still claimed.
pub(super) async fn complete(pool: &PgPool, ids: &[i64]) -> anyhow::Result<u64> {
    Ok(sqlx::query(
        "UPDATE jobs SET state = 2, locked_until = NULL, finished_at = now() \
         WHERE id = ANY($1) AND state = 1",
    )
    .bind(ids)
    .execute(pool)
    .await?
    .rows_affected())
}

async fn submit(queue: Queue, next: Arc<AtomicUsize>, total: usize) -> anyhow::Result<()> {
    loop {
        let first = next.fetch_add(SUBMIT_BATCH, Ordering::Relaxed);
        if first >= total {
            return Ok(());
        }
        let numbers: Vec<i64> = (first..(first + SUBMIT_BATCH).min(total))
            .map(|n| n as i64)
            .collect();
        queue.insert(numbers).await?;
    }
}

/// Claims and completes until `total` jobs are done across all workers; how many claims
/// brought work, and how many came back empty.
async fn worker(
    queue: Queue,
    batch: usize,
    total: usize,
    done: Arc<AtomicUsize>,
) -> anyhow::Result<(usize, usize)> {
    let (mut full, mut empty) = (0, 0);
    while done.load(Ordering::Relaxed) < total {
        let claimed = queue.claim(batch).await?;
        if claimed.is_empty() {
            empty += 1;
            tokio::time::sleep(Duration::from_millis(EMPTY_POLL_MS)).await;
            continue;
        }
        full += 1;
        let ids: Vec<i64> = claimed.iter().map(|job| job.id).collect();
        let completed = queue.complete(ids).await?;
        if completed != claimed.len() as u64 {
            bail!(
                "{} of {} completions found their job taken",
                claimed.len() as u64 - completed,
                claimed.len()
            );
        }
        done.fetch_add(claimed.len(), Ordering::Relaxed);
    }
    Ok((full, empty))
}
