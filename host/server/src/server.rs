//! The server as a library: open the store, load the policies, start the scheduler, serve HTTP
//! until told to stop.
//! Binaries and tests call `Server::open` then `run` with a listener they bound (port 0 works).

use crate::api::{self, ApiLimits, AppState};
use crate::auth::signing::SigningKeys;
use crate::auth::{AuthError, Gate};
use crate::config::ServeConfig;
use crate::scheduler::{Scheduler, SchedulerError, SchedulerOptions, SystemClock};
use crate::telemetry::Metrics;
use sluice_engine::EngineOptions;
use sluice_model::{Limits, State};
use sluice_policy_runtime::{
    FaultLimit, PolicyDecider, PolicyError, PolicyRegistry, PolicyRuntime, RegistryError,
    RegistryOptions, RuntimeOptions,
};
use sluice_store::{AccessCatalog, PolicyCatalog, Store, StoreError};
use sluice_store_postgres::PgStore;
use sluice_store_sled::{SledOptions, SledStore};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::net::TcpListener;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the scheduler: {0}")]
    Scheduler(#[from] SchedulerError),
    #[error("cannot start the policy runtime: {0}")]
    PolicyRuntime(#[from] PolicyError),
    #[error(transparent)]
    Policy(#[from] RegistryError),
    #[error("HTTP server failure: {0}")]
    Io(#[from] std::io::Error),
    #[error("stopped after a failed sync ({0}); restart to replay the log from disk")]
    StorageFailed(String),
    #[error("invalid setting: {0}")]
    Config(String),
    #[error("cannot open the token table: {0}")]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(
        "refusing to serve {0} without auth: set SLUICE_ADMIN_TOKEN (or admin_token_sha256), or pass --insecure-no-auth to serve anyone who can reach the port"
    )]
    OpenOnNetwork(std::net::SocketAddr),
}

/// The CA certificates of a PEM file, for https callbacks.
fn callback_roots(path: &std::path::Path) -> Result<Vec<reqwest::Certificate>, ServerError> {
    let invalid = |reason: String| {
        ServerError::Config(format!("callback_ca_file {}: {reason}", path.display()))
    };
    let pem = std::fs::read(path).map_err(|e| invalid(e.to_string()))?;
    let roots = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| invalid(e.to_string()))?;
    if roots.is_empty() {
        return Err(invalid("no PEM certificate in it".into()));
    }
    Ok(roots)
}

/// One backend, as each part of the server sees it.
struct Stores {
    tasks: Arc<dyn Store>,
    policies: Arc<dyn PolicyCatalog>,
    access: Arc<dyn AccessCatalog>,
}

fn shared<S: Store + PolicyCatalog + AccessCatalog>(store: Arc<S>) -> Stores {
    Stores {
        tasks: store.clone(),
        policies: store.clone(),
        access: store,
    }
}

/// The configured backend: sled in the data directory, or PostgreSQL when `store` names a
/// database. On PostgreSQL this waits for the leader lease: the engine runs in one replica at
/// a time.
fn open_stores(config: &ServeConfig) -> Result<Stores, ServerError> {
    let Some(url) = &config.store else {
        return Ok(shared(Arc::new(SledStore::open(
            &config.data_dir,
            &SledOptions {
                cache_capacity_bytes: config.cache_capacity_bytes,
                fdatasync: config.fdatasync,
                min_free_disk_bytes: config.min_free_disk_bytes,
            },
        )?)));
    };
    let store = PgStore::open(url, &config.pg_options())?;
    store.lead(&lease_holder(), &config.advertised_address(config.listen))?;
    Ok(shared(Arc::new(store)))
}

/// A name for this process in the leader lease, unique across restarts and machines.
pub(crate) fn lease_holder() -> String {
    format!(
        "{}:{}",
        std::process::id(),
        ulid::Ulid::new().to_string().to_lowercase()
    )
}

/// The API's request bounds, from the configuration (its `callback_allow` parsed already).
pub(crate) fn api_limits(
    config: &ServeConfig,
    callback_allow: sluice_model::CallbackAllow,
) -> ApiLimits {
    let mut limits = ApiLimits::new(
        Limits {
            max_payload_bytes: config.max_payload_bytes,
            callback_allow,
        },
        config.max_batch_body_bytes,
        config.inflight_body_bytes,
        config.max_policy_bytes,
    );
    limits.max_claim_wait = Duration::from_millis(config.max_claim_wait_ms);
    limits.max_result_bytes = config.max_result_bytes;
    limits.policy_data_bytes = config.max_policy_data_bytes;
    limits.max_requests_in_flight = config.max_requests_in_flight;
    limits.request_timeout = Duration::from_millis(config.request_timeout_ms);
    let nonzero = |n: u32| std::num::NonZeroU32::new(n).unwrap_or(std::num::NonZeroU32::MIN);
    limits.device_rate = api::guard::DeviceRate {
        rate_per_s: nonzero(config.device_rate_per_s),
        burst: nonzero(config.device_burst),
    };
    limits
}

pub struct Server {
    state: AppState,
    drain_timeout: Duration,
    tls: Option<Arc<crate::tls::Tls>>,
    insecure_no_auth: bool,
    history_interval: Duration,
}

/// How a server admits requests, for its first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMode {
    /// Bearer tokens are required.
    Tokens,
    /// No token configured yet: every request acts as admin (loopback only, unless insecure).
    Open,
    /// `--insecure-no-auth`.
    Disabled,
}

impl AuthMode {
    pub(crate) fn of(insecure_no_auth: bool, tokens_enforced: bool) -> AuthMode {
        if insecure_no_auth {
            AuthMode::Disabled
        } else if tokens_enforced {
            AuthMode::Tokens
        } else {
            AuthMode::Open
        }
    }
}

impl Server {
    /// Opens (or creates) the data directory and rebuilds the scheduler's state from it. This
    /// can take seconds with millions of tasks; the server is ready once it returns.
    pub fn open(config: &ServeConfig) -> Result<Server, ServerError> {
        Self::assemble(config, open_stores(config)?)
    }

    /// Opens the server on a PostgreSQL store this process already leads (`replica`): the
    /// engine is rebuilt from the database.
    pub fn open_leading(config: &ServeConfig, store: Arc<PgStore>) -> Result<Server, ServerError> {
        Self::assemble(config, shared(store))
    }

    fn assemble(config: &ServeConfig, stores: Stores) -> Result<Server, ServerError> {
        let gate = Arc::new(Gate::open(
            stores.access,
            config.admin_token_sha256.clone(),
            config.insecure_no_auth,
        )?);
        let signing_keys = SigningKeys::new(&config.policy_signing_keys)
            .map_err(|e| ServerError::Config(format!("policy_signing_keys: {e}")))?;
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(crate::tls::Tls::load(cert, key)?)),
            _ => None,
        };
        let metrics = Arc::new(Metrics::new());
        let runtime = Arc::new(PolicyRuntime::new(RuntimeOptions {
            memory_limit_bytes: config.policy_memory_limit_bytes,
            call_fuel: config.policy_call_fuel,
            max_memory_limit_bytes: config.policy_max_memory_limit_bytes,
            max_call_fuel: config.policy_max_call_fuel,
        })?);
        let concurrency = Arc::new(crate::concurrency_limits::LimitTable::open(
            stores.policies.clone(),
            &config.concurrency_limits,
        )?);
        let collections = Arc::new(crate::collections::CollectionTable::open(
            stores.policies.clone(),
        )?);
        let policies = Arc::new(PolicyRegistry::open(
            runtime,
            stores.policies,
            RegistryOptions {
                configs: config.policy_configs.clone(),
                fault_limit: FaultLimit {
                    max_faults: config.policy_max_faults,
                    window_ms: config.policy_fault_window_ms,
                },
                metrics: metrics.policies.clone(),
                max_data_bytes: config.max_policy_data_bytes,
            },
        )?);
        let callback_allow = sluice_model::CallbackAllow::parse(&config.callback_allow)
            .map_err(|reason| ServerError::Config(format!("callback_allow: {reason}")))?;
        let callback_roots = match &config.callback_ca_file {
            Some(path) => callback_roots(path)?,
            None => Vec::new(),
        };
        let scheduler = Scheduler::start(
            stores.tasks,
            Box::new(SystemClock),
            Arc::new(PolicyDecider::new(policies.clone())),
            &SchedulerOptions {
                queue_capacity: config.queue_capacity,
                engine: EngineOptions {
                    lease_ms: config.lease_ms,
                    worker_stale_ms: config.worker_stale_ms,
                    aging_interval_ms: config.aging_interval_ms,
                    split_kinds: config.split_kinds.clone(),
                    concurrency_limits: concurrency.in_force(),
                    collections: collections.all(),
                    preempt_after_ms: config.preemption.then_some(config.preempt_after_ms),
                    affinity_wait_ms: config.affinity_wait_ms,
                    batch_wait_ms: crate::config::bucket_batch_waits(&config.batch_wait_ms)
                        .map_err(|e| ServerError::Config(format!("batch_wait_ms: {e}")))?,
                    ..EngineOptions::default()
                },
                sync_claims: config.sync_claims,
                callback_allow: callback_allow.clone(),
                callback_roots,
                retention_ms: config.retention_ms,
                metrics: metrics.tasks.clone(),
                pipeline_metrics: metrics.pipeline.clone(),
                ..SchedulerOptions::default()
            },
        )?;
        let limits = api_limits(config, callback_allow.clone());
        Ok(Server {
            state: AppState::new(
                Arc::new(scheduler),
                policies,
                limits,
                metrics,
                gate,
                signing_keys,
                crate::api::CatalogTables {
                    concurrency,
                    collections,
                },
            ),
            drain_timeout: Duration::from_millis(config.drain_timeout_ms),
            tls,
            insecure_no_auth: config.insecure_no_auth,
            history_interval: Duration::from_millis(config.history_interval_ms),
        })
    }

    pub fn auth_mode(&self) -> AuthMode {
        AuthMode::of(self.insecure_no_auth, self.state.gate.is_enforced())
    }

    /// `https` when a certificate is configured, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Serves until `shutdown` resolves, then drains: refuses new submissions and claims,
    /// lets leased work report until none is left or the drain timeout passes, lets requests in
    /// flight finish, makes everything durable and returns. Leases outlive the process: work
    /// still out when it stops is reported to the next one, or expires there.
    pub async fn run(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let address = listener.local_addr()?;
        if self.auth_mode() == AuthMode::Open && !address.ip().is_loopback() {
            return Err(ServerError::OpenOnNetwork(address));
        }
        if self.auth_mode() == AuthMode::Disabled {
            tracing::warn!(%address, "auth is disabled (--insecure-no-auth): anyone who reaches the port is an admin");
        }
        let draining = self.state.draining.clone();
        let drain = self.state.drain.clone();
        let scheduler = self.state.scheduler.clone();
        let drain_timeout = self.drain_timeout;
        let app = api::router(self.state.clone());
        let mut storage_failed = scheduler.storage_failed();
        let signal = async move {
            let failure = async {
                // The writer gone without a failure: this never resolves.
                if storage_failed.wait_for(Option::is_some).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = shutdown => {}
                () = failure => {
                    // Nothing can be made durable any more: no drain, only the requests in
                    // flight are let finish (each is answered 503 `storage-failed`).
                    draining.store(true, Ordering::Release);
                    drain.send_replace(true);
                    tracing::error!("a sync failed: stopping; a restart replays the log from disk");
                    return;
                }
            }
            tracing::info!("draining: no new submissions or claims; waiting for leased work");
            draining.store(true, Ordering::Release);
            drain.send_replace(true);
            if let Err(error) = scheduler.drain().await {
                tracing::warn!(%error, "could not tell the engine it drains; it may still preempt");
            }
            let leased = || {
                let snapshot = scheduler.snapshot();
                let count = |state| snapshot.tasks_by_state.get(&state).copied().unwrap_or(0);
                count(State::Claimed) + count(State::Running)
            };
            let deadline = tokio::time::Instant::now() + drain_timeout;
            while leased() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tracing::info!(
                still_leased = leased(),
                "drain over; finishing requests in flight"
            );
        };
        let sampling = tokio::spawn(sample_history(
            self.state.scheduler.clone(),
            self.state.metrics.tasks.history.clone(),
            self.history_interval,
        ));
        let rollouts = tokio::spawn(crate::rollout::drive(self.state.clone()));
        let served = match &self.tls {
            Some(tls) => {
                let reloading = tokio::spawn(reload_on_sighup(tls.clone()));
                let served = axum::serve(tls.listener(listener)?, app)
                    .with_graceful_shutdown(signal)
                    .await;
                reloading.abort();
                served
            }
            None => {
                axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await
            }
        };
        sampling.abort();
        rollouts.abort();
        self.state.scheduler.shutdown().await;
        served?;
        if let Some(reason) = self.state.scheduler.storage_failed().borrow().clone() {
            return Err(ServerError::StorageFailed(reason));
        }
        tracing::info!("stopped; everything acknowledged is on disk");
        Ok(())
    }
}

/// Takes one sample of the status page's history every `interval`, the first at once.
async fn sample_history(
    scheduler: Arc<crate::scheduler::Scheduler>,
    history: Arc<crate::telemetry::History>,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let interval_ms = interval.as_millis() as u64;
    loop {
        ticks.tick().await;
        let snapshot = scheduler.snapshot();
        let queued = sluice_model::Priority::ALL
            .map(|bucket| snapshot.queued_by_bucket.get(&bucket).copied().unwrap_or(0) as u64);
        let now_ms = crate::scheduler::Clock::now_ms(&crate::scheduler::SystemClock);
        history.sample(now_ms, interval_ms, queued);
    }
}

/// Reads the certificate and key again on every SIGHUP; a bad pair is logged and the old one
/// kept.
async fn reload_on_sighup(tls: Arc<crate::tls::Tls>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hangups) = signal(SignalKind::hangup()) else {
        tracing::warn!("cannot watch SIGHUP; the TLS certificate is reloaded only by a restart");
        return;
    };
    while hangups.recv().await.is_some() {
        match tls.reload() {
            Ok(()) => tracing::info!("TLS certificate reloaded"),
            Err(error) => {
                tracing::error!(%error, "TLS certificate not reloaded; keeping the old one")
            }
        }
    }
}
