//! One of several `sluice serve` replicas on a shared PostgreSQL store: it leads (holds the
//! lease and runs the engine) or follows (forwards every request to the leader) and takes the
//! lease over, rebuilding the engine from the database, when the leader's runs out.
//!
//! Why one engine: the engine is a deterministic single-writer state machine, and its
//! guarantees (no task handed to two live leases, fair weighted dispatch, one breaker per
//! worker) come from that. One leader at a time keeps all of it, and the fencing epoch that
//! every commit checks keeps a deposed leader from writing beside its successor.

use crate::api::forward::{self, Forwarder};
use crate::auth::Gate;
use crate::config::ServeConfig;
use crate::server::{AuthMode, Server, ServerError, api_limits, lease_holder};
use sluice_store_postgres::PgStore;
use sluice_store_postgres::leader::RENEW_MS;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What a replica does once it has looked at the lease.
pub enum ReplicaRole {
    Leading(Server),
    Following(Box<Follower>),
}

/// Opens the store and decides: leads at once if the lease is free; waits out a lease that is
/// not being renewed (its holder died, as when this replica's previous process was killed);
/// follows a leader that renews. Blocking: at most a lease's length plus a renewal.
pub fn start(config: &ServeConfig, bound: SocketAddr) -> Result<ReplicaRole, ServerError> {
    let url = config
        .store
        .as_deref()
        .ok_or_else(|| ServerError::Config("store: replicas need a postgres:// URL".into()))?;
    let store = Arc::new(PgStore::open(url, &config.pg_options())?);
    let holder = lease_holder();
    let address = config.advertised_address(bound);
    let first = store.leader()?;
    loop {
        if store.take_lead(&holder, &address)?.is_some() {
            return Ok(ReplicaRole::Leading(Server::open_leading(config, store)?));
        }
        let now = store.leader()?;
        if now.live && (now.epoch, now.expires_at_ms) != (first.epoch, first.expires_at_ms) {
            tracing::info!(leader = %now.address, epoch = now.epoch, "following the leader");
            return Follower::new(config, store, holder, address, now.address)
                .map(|follower| ReplicaRole::Following(Box::new(follower)));
        }
        std::thread::sleep(Duration::from_millis(RENEW_MS / 4));
    }
}

/// A replica that forwards to the leader and stands by to take over.
pub struct Follower {
    config: ServeConfig,
    store: Arc<PgStore>,
    holder: String,
    address: String,
    forwarder: Arc<Forwarder>,
    leader_address: String,
    auth: AuthMode,
    tls: Option<Arc<crate::tls::Tls>>,
}

impl Follower {
    fn new(
        config: &ServeConfig,
        store: Arc<PgStore>,
        holder: String,
        address: String,
        leader_address: String,
    ) -> Result<Follower, ServerError> {
        // The leader checks tokens; a follower only needs to know whether they are enforced,
        // to refuse an open network port as the leader would.
        let gate = Gate::open(
            store.clone(),
            config.admin_token_sha256.clone(),
            config.insecure_no_auth,
        )?;
        let auth = AuthMode::of(config.insecure_no_auth, gate.is_enforced());
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some(Arc::new(crate::tls::Tls::load(cert, key)?)),
            _ => None,
        };
        let forwarder = Arc::new(Forwarder::new(
            store.clone(),
            holder.clone(),
            &address,
            tls.is_some(),
        ));
        Ok(Follower {
            config: config.clone(),
            store,
            holder,
            address,
            forwarder,
            leader_address,
            auth,
            tls,
        })
    }

    /// The leader's address when this replica started following.
    pub fn leader_address(&self) -> &str {
        &self.leader_address
    }

    pub fn auth_mode(&self) -> AuthMode {
        self.auth
    }

    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Forwards requests until `shutdown` turns true (then `None`) or this replica takes the
    /// lease (then the server to run, and the same listening socket to run it on: connections
    /// that arrive meanwhile wait in its backlog). Requests still being forwarded finish in
    /// the background.
    pub async fn run(
        self,
        listener: TcpListener,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Option<(Server, TcpListener)>, ServerError> {
        let bound = listener.local_addr()?;
        if self.auth == AuthMode::Open && !bound.ip().is_loopback() {
            return Err(ServerError::OpenOnNetwork(bound));
        }
        let std_listener = listener.into_std()?;
        let spare = std_listener.try_clone()?;
        let listener = TcpListener::from_std(std_listener)?;
        let limits = api_limits(&self.config, Default::default());
        let app = forward::router(self.forwarder.clone(), &limits);
        let (stop, mut stopping) = watch::channel(false);
        let stopped = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        let serving = match &self.tls {
            Some(tls) => {
                let serve =
                    axum::serve(tls.listener(listener)?, app).with_graceful_shutdown(stopped);
                tokio::spawn(async move { serve.await })
            }
            None => {
                let serve = axum::serve(listener, app).with_graceful_shutdown(stopped);
                tokio::spawn(async move { serve.await })
            }
        };
        let mut ticks = tokio::time::interval(Duration::from_millis(RENEW_MS / 4));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.wait_for(|stop| *stop) => {
                    stop.send_replace(true);
                    // Forwarded requests are bounded by the request timeout.
                    let _ = tokio::time::timeout(limits.request_timeout, serving).await;
                    return Ok(None);
                }
                _ = ticks.tick() => {}
            }
            let (store, holder, address) = (
                self.store.clone(),
                self.holder.clone(),
                self.address.clone(),
            );
            let taken = tokio::task::spawn_blocking(move || store.take_lead(&holder, &address))
                .await
                .map_err(|e| ServerError::Config(format!("lease task: {e}")))?;
            match taken {
                Ok(Some(epoch)) => {
                    tracing::info!(epoch, "taking over as leader: rebuilding the engine");
                    let (config, store) = (self.config.clone(), self.store.clone());
                    let server =
                        tokio::task::spawn_blocking(move || Server::open_leading(&config, store))
                            .await
                            .map_err(|e| ServerError::Config(format!("open task: {e}")))??;
                    stop.send_replace(true);
                    tracing::info!(epoch, "leading");
                    return Ok(Some((server, TcpListener::from_std(spare)?)));
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "cannot read the leader lease; retrying"),
            }
        }
    }
}
