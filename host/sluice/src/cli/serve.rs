//! `sluice serve`: resolve the configuration, open the store, bind, announce, serve.

use anyhow::Context;
use sluice_server::config::{FileConfig, Overrides, ServeConfig};
use sluice_server::replica::{self, ReplicaRole};
use sluice_server::server::{AuthMode, Server};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A TOML file of settings (see README); flags and SLUICE_* variables override it.
    #[arg(long, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Where the embedded store (sled, the default backend) keeps the state [default: ./sluice-data]
    #[arg(long, env = "SLUICE_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// A postgres:// URL: keep the state in that PostgreSQL database, which several replicas
    /// may share, instead of sled in --data-dir [default: none]
    #[arg(long, env = "SLUICE_STORE", hide_env_values = true)]
    store: Option<String>,
    /// host:port other replicas reach this one's API at, with --store [default: the bound
    /// listen address]
    #[arg(long, env = "SLUICE_ADVERTISE")]
    advertise: Option<String>,
    /// Address to listen on; port 0 picks a free port [default: 127.0.0.1:7700]
    #[arg(long, env = "SLUICE_LISTEN")]
    listen: Option<SocketAddr>,
    /// Largest task payload accepted, in bytes [default: 1048576]
    #[arg(long, env = "SLUICE_MAX_PAYLOAD_BYTES")]
    max_payload_bytes: Option<usize>,
    /// fdatasync after each group flush so acknowledged tasks survive power loss [default: true]
    #[arg(long, env = "SLUICE_FDATASYNC")]
    fdatasync: Option<bool>,
    /// Answer a claim only once its leases are synced to disk, not once they are written to the
    /// log: a lease then survives a power loss too [default: false]
    #[arg(long, env = "SLUICE_SYNC_CLAIMS")]
    sync_claims: Option<bool>,
    /// How long a claim or a lease heartbeat holds a task, in ms [default: 30000]
    #[arg(long, env = "SLUICE_LEASE_MS")]
    lease_ms: Option<u64>,
    /// On SIGTERM or SIGINT, how long running work may still report, in ms [default: 90000]
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT_MS")]
    drain_timeout_ms: Option<u64>,
    /// Free space kept on the data directory's filesystem, in bytes: below it writes are
    /// answered 507 until space is freed [default: 134217728]
    #[arg(long, env = "SLUICE_MIN_FREE_DISK_BYTES")]
    min_free_disk_bytes: Option<u64>,
    /// Hosts, addresses or CIDRs a callback_url may name although loopback or private,
    /// comma-separated (e.g. 127.0.0.1,10.0.0.0/8,receiver.lab) [default: none]
    #[arg(long, env = "SLUICE_CALLBACK_ALLOW", value_delimiter = ',')]
    callback_allow: Option<Vec<String>>,
    /// How long ended tasks are kept (with their payloads, keys and events), in ms, counted
    /// from their last change [default: 2592000000, 30 days]
    #[arg(long, env = "SLUICE_RETENTION_MS")]
    retention_ms: Option<u64>,
    /// A PEM file of CA certificates an https callback's server may be signed by, beside the
    /// system's roots [default: none]
    #[arg(long, env = "SLUICE_CALLBACK_CA_FILE")]
    callback_ca_file: Option<PathBuf>,
    /// Serve without auth even on a non-loopback address: anyone who reaches the port is an
    /// admin. Warned at every start. (The bootstrap admin token is read from the
    /// SLUICE_ADMIN_TOKEN variable only, never from a flag, so it stays out of `ps`.)
    #[arg(long)]
    insecure_no_auth: bool,
    /// A PEM certificate chain: serve https with it (and --tls-key); SIGHUP reloads both
    #[arg(long, env = "SLUICE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert
    #[arg(long, env = "SLUICE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Each device token's sustained request rate, per second [default: 100]
    #[arg(long, env = "SLUICE_DEVICE_RATE_PER_S")]
    device_rate_per_s: Option<u32>,
    /// How many requests a device token may send at once above its rate [default: 200]
    #[arg(long, env = "SLUICE_DEVICE_BURST")]
    device_burst: Option<u32>,
    /// A policy setting, kind.name=value (e.g. retry.initial_delay_ms=100); repeatable.
    /// Overrides the same setting in the file's [policies.<kind>] table.
    #[arg(long = "policy-config")]
    policy_settings: Vec<String>,
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let overrides = Overrides {
        data_dir: args.data_dir,
        listen: args.listen,
        max_payload_bytes: args.max_payload_bytes,
        fdatasync: args.fdatasync,
        sync_claims: args.sync_claims,
        lease_ms: args.lease_ms,
        drain_timeout_ms: args.drain_timeout_ms,
        min_free_disk_bytes: args.min_free_disk_bytes,
        callback_ca_file: args.callback_ca_file,
        retention_ms: args.retention_ms,
        callback_allow: args.callback_allow,
        policy_settings: args.policy_settings,
        admin_token: std::env::var("SLUICE_ADMIN_TOKEN")
            .ok()
            .filter(|token| !token.is_empty()),
        insecure_no_auth: args.insecure_no_auth,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        store: args.store,
        advertise: args.advertise,
        device_rate_per_s: args.device_rate_per_s,
        device_burst: args.device_burst,
    };
    let config = ServeConfig::resolve(file, overrides)?;
    if config.store.is_some() {
        return serve_replica(config).await;
    }
    let data_dir = config.data_dir.display().to_string();
    let server = tokio::task::spawn_blocking(move || Server::open(&config).map(|s| (s, config)))
        .await
        .context("opening the store")??;
    let (server, config) = server;
    let listener = bind(config.listen).await?;
    let address = listener.local_addr()?;
    let auth = auth_words(server.auth_mode());
    tracing::info!(%address, data_dir, auth, "ready");
    announce(server.scheme(), address, auth)?;
    server.run(listener, shutdown_signal()).await?;
    Ok(())
}

/// One replica on a PostgreSQL store: bound first, so that the lease names the address it
/// serves; then leading, or following until it takes the lease over.
async fn serve_replica(config: ServeConfig) -> anyhow::Result<()> {
    let listener = bind(config.listen).await?;
    let address = listener.local_addr()?;
    let store = config
        .store
        .as_deref()
        .map(sluice_store_postgres::redacted)
        .unwrap_or_default();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        stop.send_replace(true);
    });
    let until_stopped = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let config_for_start = config.clone();
    let role = tokio::task::spawn_blocking(move || replica::start(&config_for_start, address))
        .await
        .context("opening the store")??;
    let (server, listener) = match role {
        ReplicaRole::Leading(server) => {
            let auth = auth_words(server.auth_mode());
            tracing::info!(%address, store, auth, "ready, leading");
            announce(server.scheme(), address, auth)?;
            (server, listener)
        }
        ReplicaRole::Following(follower) => {
            let auth = auth_words(follower.auth_mode());
            tracing::info!(%address, store, auth, leader = follower.leader_address(), "ready, following");
            announce(follower.scheme(), address, auth)?;
            match follower.run(listener, stopping.clone()).await? {
                Some(taken_over) => taken_over,
                None => return Ok(()),
            }
        }
    };
    server.run(listener, until_stopped(stopping)).await?;
    Ok(())
}

async fn bind(listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))
}

fn auth_words(mode: AuthMode) -> &'static str {
    match mode {
        AuthMode::Tokens => "auth: bearer tokens",
        AuthMode::Open => "auth: off (loopback, no token configured)",
        AuthMode::Disabled => "auth: DISABLED by --insecure-no-auth",
    }
}

/// The one line on stdout: tools and tests read the bound address from its first word after
/// `listening on`.
fn announce(scheme: &str, address: SocketAddr, auth: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {scheme}://{address} ({auth})")?;
    stdout.flush()?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}
