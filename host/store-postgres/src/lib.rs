//! The PostgreSQL store (`--store postgres://...`): the storage API over one database that
//! several Sluice replicas share. It owns the connection pools, the migrations (embedded, run at
//! open under sqlx's advisory lock), the leader lease with its fencing epoch (`leader`), and a
//! small tokio runtime of its own, so that its synchronous trait methods can be called from any
//! thread, the server's async handlers included, without nesting runtimes.
//!
//! A commit is one transaction that first checks the fencing epoch under a row lock, so a
//! deposed leader's late commit fails; it commits asynchronously (`synchronous_commit = off`),
//! and `sync` is one synchronous write, whose WAL flush covers every commit before it: group
//! commit as in the embedded store, one WAL flush for many groups. A commit appends its task
//! rows to a write-ahead log (`wal`) that the materializer writes into the task table later
//! (`materializer`); until then readers find them in the overlay (`overlay`).

mod catalog;
mod events;
pub mod leader;
mod materializer;
mod migrations;
mod overlay;
mod tasks;
mod wal;

pub use leader::{LeaderInfo, Leadership};

use materializer::{Materializer, WriteBehind};
use sluice_store::StoreError;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::future::Future;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the store connects.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// Connections held at most for reads, retention and the catalog; the engine's own path
    /// (commits, syncs, its key reads, the materializer and the leader lease) has
    /// `ENGINE_CONNECTIONS` besides.
    pub max_connections: u32,
    /// How long a caller waits for a free connection before the call fails.
    pub acquire_timeout: Duration,
    /// The longest any one statement may run, so a stuck query cannot hang the writer.
    pub statement_timeout: Duration,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
        }
    }
}

/// Whether `location` names a PostgreSQL database (`postgres://` or `postgresql://`).
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// A database URL with its password (if any) masked, for logs and errors.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "(an unparsable URL)".into(),
    }
}

/// Connections kept for the leader's own path: the committer, the flusher, the writer's key
/// reads, the materializer and the lease renewal each use at most one at a time. Apart from
/// the shared pool so that readers holding every connection there (a burst of listings, each
/// examining thousands of rows) can neither hold a commit back nor let the lease run out.
const ENGINE_CONNECTIONS: u32 = 5;

pub struct PgStore {
    pool: PgPool,
    /// See `ENGINE_CONNECTIONS`.
    engine_pool: PgPool,
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
    /// The fencing epoch this process leads under, once it leads; 0 before.
    leadership: Arc<Leadership>,
    /// Set by the first failed sync or by losing the lease: from then on nothing is written.
    failure: Arc<Mutex<Option<String>>>,
    /// Held while an audited write or a policy write picks its seq (the database's advisory
    /// lock serialises replicas; this one keeps a process's own threads off the pool meanwhile).
    catalog_writes: Mutex<()>,
    /// The task rows committed to the write-ahead log and not yet written into the table.
    pending: Arc<WriteBehind>,
    /// Writes them there (`materializer::Materializer::run`).
    materializer_thread: Option<JoinHandle<()>>,
}

/// A database failure as the store API's error: I/O stays I/O, the rest is the backend's.
pub(crate) fn backend(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::Io(io) => StoreError::Io(io),
        other => StoreError::Backend(Box::new(other)),
    }
}

/// The error of a call through the fence (`sluice_fence`, migration 0007): a deposed leader's
/// (SQLSTATE SL001) stops the store; any other travels as it is.
fn fenced_call_error(error: sqlx::Error) -> StoreError {
    match error {
        sqlx::Error::Database(error) if error.code().as_deref() == Some("SL001") => {
            StoreError::Failed(error.message().to_owned())
        }
        other => backend(other),
    }
}

pub(crate) fn corrupt(what: &'static str, detail: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        what,
        detail: detail.to_string(),
    }
}

/// `u64` values (times, seqs) as PostgreSQL's `bigint`: every one Sluice makes fits.
fn int8(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn uint8(value: i64, what: &'static str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| corrupt(what, format!("negative number {value}")))
}

/// Creates an empty database on the server `url` points at (its user must be allowed to) and
/// returns the new database's URL: for tests and `sluice bench`, which want a fresh store per
/// run. The name is `prefix` and a random suffix.
pub fn scratch_database(url: &str, prefix: &str) -> Result<String, StoreError> {
    let open_error = |source: Box<dyn std::error::Error + Send + Sync>| StoreError::Open {
        path: redacted(url),
        source,
    };
    if !prefix.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return Err(open_error(
            "a database prefix is lowercase letters and _".into(),
        ));
    }
    let name = format!("{prefix}_{}", ulid::Ulid::new().to_string().to_lowercase());
    let mut database_url = url::Url::parse(url).map_err(|e| open_error(Box::new(e)))?;
    database_url.set_path(&name);
    admin_statement(url, format!("CREATE DATABASE {name}")).map_err(open_error)?;
    Ok(database_url.to_string())
}

/// Drops a database `scratch_database` made, closing its connections.
pub fn drop_scratch_database(database_url: &str) -> Result<(), StoreError> {
    let parsed = url::Url::parse(database_url).map_err(|e| StoreError::Backend(Box::new(e)))?;
    let name = parsed.path().trim_start_matches('/').to_owned();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(StoreError::Backend("not a scratch database's URL".into()));
    }
    let mut server = parsed;
    server.set_path("postgres");
    admin_statement(
        server.as_str(),
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .map_err(StoreError::Backend)
}

/// Runs one statement on a connection of its own (CREATE and DROP DATABASE cannot run in a
/// transaction or share a pool with the database they name).
fn admin_statement(
    url: &str,
    statement: String,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use sqlx::Connection;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let url = url.to_owned();
    // A thread of its own, so this works from inside another runtime too.
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let mut connection = sqlx::PgConnection::connect(&url).await?;
            sqlx::raw_sql(&statement).execute(&mut connection).await?;
            connection.close().await?;
            Ok(())
        })
    })
    .join()
    .map_err(|_| "the database statement's thread panicked")?
}

impl PgStore {
    /// Connects to `url` and brings its schema up to this build's migrations (each replica
    /// may do so at once: sqlx serialises them under an advisory lock). Leading is separate
    /// (`lead`): a store that does not lead serves reads only.
    pub fn open(url: &str, options: &PgOptions) -> Result<PgStore, StoreError> {
        let open_error = |source: Box<dyn std::error::Error + Send + Sync>| StoreError::Open {
            path: redacted(url),
            source,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-postgres")
            .enable_all()
            .build()?;
        let statement_timeout = format!("{}ms", options.statement_timeout.as_millis());
        let connect = PgConnectOptions::from_str(url)
            .map_err(|e| open_error(Box::new(e)))?
            .application_name("sluice")
            // Every query is planned for its arguments and the tables as they are: a generic
            // plan cached while a table was nearly empty (a new store's first seconds) kept a
            // sequential scan of the keys for every later group, 4-5 ms each by 2,000 keys.
            // The commit function is the exception (migration 0006): its statements have one
            // right plan, which it keeps.
            .options([
                ("statement_timeout", statement_timeout.as_str()),
                ("plan_cache_mode", "force_custom_plan"),
            ]);
        let pool_options = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout);
        let engine_pool_options = PgPoolOptions::new()
            .max_connections(ENGINE_CONNECTIONS)
            .acquire_timeout(options.acquire_timeout);
        let (pool, engine_pool) = runtime
            .block_on(async move {
                let pool = pool_options.connect_with(connect.clone()).await?;
                migrations::migrator().await?.run(&pool).await?;
                // Connected at first use: a replica's first attempt to take the lease.
                let engine_pool = engine_pool_options.connect_lazy_with(connect);
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((pool, engine_pool))
            })
            .map_err(open_error)?;
        let handle = runtime.handle().clone();
        let mut store = PgStore {
            pool,
            engine_pool,
            runtime: Some(runtime),
            handle,
            leadership: Arc::new(Leadership::default()),
            failure: Arc::new(Mutex::new(None)),
            catalog_writes: Mutex::new(()),
            pending: Arc::default(),
            materializer_thread: None,
        };
        let materializer = store.materializer();
        store.materializer_thread = Some(
            std::thread::Builder::new()
                .name("sluice-pg-rows".into())
                .spawn(move || materializer.run())?,
        );
        Ok(store)
    }

    /// What the materializer's rounds (and the replay) work with.
    fn materializer(&self) -> Materializer {
        Materializer {
            pending: self.pending.clone(),
            pool: self.engine_pool(),
            handle: self.handle.clone(),
            leadership: self.leadership.clone(),
            failure: self.failure.clone(),
        }
    }

    /// Runs `work` on the store's runtime and waits for it, from any thread.
    fn block<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        run_on(&self.handle, work)
    }

    fn pool(&self) -> PgPool {
        self.pool.clone()
    }

    /// The pool of the leader's own path (`ENGINE_CONNECTIONS`).
    fn engine_pool(&self) -> PgPool {
        self.engine_pool.clone()
    }

    pub(crate) fn fail(&self, reason: String) {
        fail_with(&self.failure, reason);
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn refuse_if_failed(&self) -> Result<(), StoreError> {
        match self.failure() {
            Some(reason) => Err(StoreError::Failed(reason)),
            None => Ok(()),
        }
    }
}

/// Runs `work` on a store's runtime and waits for it, from any thread but the runtime's own.
fn run_on<T, F>(handle: &tokio::runtime::Handle, work: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
{
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    handle.spawn(async move {
        let _ = sender.send(work.await);
    });
    receiver
        .recv()
        .map_err(|_| StoreError::Failed("the PostgreSQL store has stopped".into()))?
}

/// Records the first reason the store stopped taking writes.
fn fail_with(failure: &Mutex<Option<String>>, reason: String) {
    let mut failure = failure.lock().unwrap_or_else(|p| p.into_inner());
    if failure.is_none() {
        tracing::error!(%reason, "the PostgreSQL store takes no more writes; restart to rebuild from the database");
        *failure = Some(reason);
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // The rows pending are written first, so the next leader has little to replay.
        self.pending.stop();
        if let Some(thread) = self.materializer_thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the PostgreSQL store's materializer thread panicked");
        }
        // A clean stop hands the lease over at once instead of letting it run out.
        if self.leadership.epoch() != 0 && self.failure().is_none() {
            let _ = self.release();
        }
        if let Some(runtime) = self.runtime.take() {
            // Dropping a runtime inside another one's context panics; this does not wait.
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_ahead_tests;
