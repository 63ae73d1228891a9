//! Server configuration: defaults, overridden by a TOML file, by `SLUICE_*` environment
//! variables, then by command-line flags (clap reads the last two).

use serde::Deserialize;
use sluice_model::PolicyKind;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("invalid setting `{name}`: {reason}")]
    Invalid { name: &'static str, reason: String },
}

/// Everything `sluice serve` needs, resolved.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub max_payload_bytes: usize,
    /// The largest `result` a worker's complete report may carry, serialized.
    pub max_result_bytes: usize,
    /// Hosts, addresses and CIDRs a `callback_url` may name although private or loopback.
    pub callback_allow: Vec<String>,
    /// A PEM file of CA certificates https callbacks may be signed by, beside the system's.
    pub callback_ca_file: Option<PathBuf>,
    pub max_batch_body_bytes: usize,
    /// Request bodies held in memory at once; past it, requests are refused as overloaded.
    pub inflight_body_bytes: usize,
    pub queue_capacity: usize,
    pub cache_capacity_bytes: u64,
    /// Free space kept on the data directory's filesystem; below it writes get 507.
    pub min_free_disk_bytes: u64,
    pub fdatasync: bool,
    /// Answer claims only once their leases are synced, not once they are written to the log.
    pub sync_claims: bool,
    /// Each policy kind's settings, as the `name=value` lines its component's `init` takes.
    pub policy_configs: BTreeMap<PolicyKind, String>,
    pub policy_memory_limit_bytes: usize,
    pub policy_call_fuel: u64,
    /// The most an upload may grant its version (`memory_limit_bytes`, `call_fuel`).
    pub policy_max_memory_limit_bytes: usize,
    pub policy_max_call_fuel: u64,
    /// A policy version is deactivated after this many faults within the window.
    pub policy_max_faults: u32,
    pub policy_fault_window_ms: u64,
    /// The largest policy component an upload may carry.
    pub max_policy_bytes: usize,
    /// A policy version's data blobs, all together, in bytes.
    pub max_policy_data_bytes: usize,
    /// How long a claim or a lease heartbeat holds a task.
    pub lease_ms: u64,
    /// A worker whose last heartbeat is older than this gets no tasks.
    pub worker_stale_ms: u64,
    /// How often the aging policy looks at the waiting tasks.
    pub aging_interval_ms: u64,
    /// How often the status page's 15-minute history takes a sample.
    pub history_interval_ms: u64,
    /// On SIGTERM, how long running work may still report before the server stops.
    pub drain_timeout_ms: u64,
    /// The longest a claim may wait for work.
    pub max_claim_wait_ms: u64,
    /// Task kinds split on admission by the split policy and merged by the merge policy.
    pub split_kinds: Vec<String>,
    /// Ended tasks (with their payloads, keys and events) are removed this long after their
    /// last change.
    pub retention_ms: u64,
    /// Hex SHA-256 of the bootstrap admin token (from `admin_token_sha256`, or hashed from
    /// `SLUICE_ADMIN_TOKEN`).
    pub admin_token_sha256: Option<String>,
    /// Serve without auth even on a non-loopback address (warned at every start).
    pub insecure_no_auth: bool,
    /// The ed25519 keys policy uploads must be signed by; none: no signature asked.
    pub policy_signing_keys: Vec<crate::auth::signing::KeyConfig>,
    /// Each device token's sustained request rate, and the burst above it.
    pub device_rate_per_s: u32,
    pub device_burst: u32,
    /// Requests answered at once; past it, 503 at once.
    pub max_requests_in_flight: usize,
    /// The longest a request may take to its answer's headers.
    pub request_timeout_ms: u64,
    /// PEM certificate chain and private key: serve https (rustls) instead of http.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// A `postgres://` URL: keep the state in that database, shared with other replicas,
    /// instead of sled in `data_dir`.
    pub store: Option<String>,
    /// `host:port` other replicas reach this one's API at (written to the leader lease);
    /// the bound listen address when unset.
    pub advertise: Option<String>,
    /// On PostgreSQL: connections held at most for reads, retention and the catalog (the
    /// engine's own path has 5 more), how long a call waits for one, and the longest any one
    /// statement may run.
    pub pg_max_connections: u32,
    pub pg_acquire_timeout_ms: u64,
    pub pg_statement_timeout_ms: u64,
    /// Limits on tasks leased at once per concurrency key (or key prefix ending in `*`);
    /// those set through the API override these key by key.
    pub concurrency_limits: Vec<sluice_model::ConcurrencyLimit>,
    /// Whether an urgent task that waited `preempt_after_ms` with no worker free may stop a
    /// lower bucket's attempt to take its place.
    pub preemption: bool,
    pub preempt_after_ms: u64,
    /// How long a task waits for a worker with its model loaded before it goes to one that
    /// must load it.
    pub affinity_wait_ms: u64,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            data_dir: PathBuf::from("./sluice-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            max_payload_bytes: 1024 * 1024,
            max_result_bytes: 1024 * 1024,
            callback_allow: Vec::new(),
            callback_ca_file: None,
            max_batch_body_bytes: 16 * 1024 * 1024,
            inflight_body_bytes: 256 * 1024 * 1024,
            queue_capacity: 4096,
            cache_capacity_bytes: 512 * 1024 * 1024,
            min_free_disk_bytes: sluice_store::DEFAULT_MIN_FREE_DISK_BYTES,
            fdatasync: true,
            sync_claims: false,
            policy_configs: BTreeMap::new(),
            policy_memory_limit_bytes: 16 * 1024 * 1024,
            policy_call_fuel: 50_000_000,
            policy_max_memory_limit_bytes: 256 * 1024 * 1024,
            policy_max_call_fuel: 10_000_000_000,
            policy_max_faults: 5,
            policy_fault_window_ms: 60_000,
            // An interpreted policy (Python's runtime) is about 18 MiB.
            max_policy_bytes: 32 * 1024 * 1024,
            max_policy_data_bytes: sluice_policy_runtime::DEFAULT_MAX_DATA_BYTES,
            lease_ms: 30_000,
            worker_stale_ms: 30_000,
            aging_interval_ms: 1_000,
            history_interval_ms: crate::telemetry::DEFAULT_HISTORY_INTERVAL_MS,
            drain_timeout_ms: 90_000,
            max_claim_wait_ms: 30_000,
            split_kinds: vec!["vector.search".to_owned()],
            retention_ms: crate::scheduler::DEFAULT_RETENTION_MS,
            admin_token_sha256: None,
            insecure_no_auth: false,
            policy_signing_keys: Vec::new(),
            device_rate_per_s: 100,
            device_burst: 200,
            max_requests_in_flight: 4096,
            request_timeout_ms: 60_000,
            tls_cert: None,
            tls_key: None,
            store: None,
            pg_max_connections: 16,
            pg_acquire_timeout_ms: 5_000,
            pg_statement_timeout_ms: 30_000,
            advertise: None,
            concurrency_limits: Vec::new(),
            preemption: false,
            preempt_after_ms: 5_000,
            affinity_wait_ms: 10_000,
        }
    }
}

/// The `[server]`-level keys a config file may set; any other key is an error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub max_payload_bytes: Option<usize>,
    pub max_result_bytes: Option<usize>,
    pub callback_allow: Option<Vec<String>>,
    pub callback_ca_file: Option<PathBuf>,
    pub max_batch_body_bytes: Option<usize>,
    pub inflight_body_bytes: Option<usize>,
    pub queue_capacity: Option<usize>,
    pub cache_capacity_bytes: Option<u64>,
    pub min_free_disk_bytes: Option<u64>,
    pub fdatasync: Option<bool>,
    pub sync_claims: Option<bool>,
    pub policy_memory_limit_bytes: Option<usize>,
    pub policy_call_fuel: Option<u64>,
    pub policy_max_memory_limit_bytes: Option<usize>,
    pub policy_max_call_fuel: Option<u64>,
    pub policy_max_faults: Option<u32>,
    pub policy_fault_window_ms: Option<u64>,
    pub max_policy_bytes: Option<usize>,
    pub max_policy_data_bytes: Option<usize>,
    pub lease_ms: Option<u64>,
    pub worker_stale_ms: Option<u64>,
    pub aging_interval_ms: Option<u64>,
    pub history_interval_ms: Option<u64>,
    pub drain_timeout_ms: Option<u64>,
    pub max_claim_wait_ms: Option<u64>,
    pub split_kinds: Option<Vec<String>>,
    pub retention_ms: Option<u64>,
    pub admin_token_sha256: Option<String>,
    pub policy_signing_keys: Option<Vec<crate::auth::signing::KeyConfig>>,
    pub device_rate_per_s: Option<u32>,
    pub device_burst: Option<u32>,
    pub max_requests_in_flight: Option<usize>,
    pub request_timeout_ms: Option<u64>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub store: Option<String>,
    pub advertise: Option<String>,
    pub pg_max_connections: Option<u32>,
    pub pg_acquire_timeout_ms: Option<u64>,
    pub pg_statement_timeout_ms: Option<u64>,
    /// `[concurrency_limits]`: `"scanner-*" = 1`, `"model:seg-v3" = 2`.
    pub concurrency_limits: Option<BTreeMap<String, u32>>,
    pub preemption: Option<bool>,
    pub preempt_after_ms: Option<u64>,
    pub affinity_wait_ms: Option<u64>,
    /// `[policies.<kind>]` tables: each policy's settings, e.g.
    /// `[policies.retry] initial_delay_ms = 300000`.
    #[serde(default)]
    pub policies: BTreeMap<String, toml::Table>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Settings given on the command line or in the environment; each overrides the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub max_payload_bytes: Option<usize>,
    pub fdatasync: Option<bool>,
    pub sync_claims: Option<bool>,
    pub lease_ms: Option<u64>,
    pub drain_timeout_ms: Option<u64>,
    pub min_free_disk_bytes: Option<u64>,
    pub callback_ca_file: Option<PathBuf>,
    pub retention_ms: Option<u64>,
    /// Replaces the file's `callback_allow` when given.
    pub callback_allow: Option<Vec<String>>,
    /// `kind.name=value` settings of policies; each overrides the same setting in the file.
    pub policy_settings: Vec<String>,
    /// The bootstrap admin token's text (`SLUICE_ADMIN_TOKEN`); only its hash is kept.
    pub admin_token: Option<String>,
    pub insecure_no_auth: bool,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub device_rate_per_s: Option<u32>,
    pub device_burst: Option<u32>,
    pub store: Option<String>,
    pub advertise: Option<String>,
}

impl ServeConfig {
    /// The address replicas forward to while this one leads: `advertise`, or the address it
    /// is bound to (`bound`, which knows the port that port 0 picked).
    pub fn advertised_address(&self, bound: SocketAddr) -> String {
        self.advertise.clone().unwrap_or_else(|| bound.to_string())
    }

    /// How the PostgreSQL store connects.
    pub fn pg_options(&self) -> sluice_store_postgres::PgOptions {
        sluice_store_postgres::PgOptions {
            max_connections: self.pg_max_connections,
            acquire_timeout: Duration::from_millis(self.pg_acquire_timeout_ms),
            statement_timeout: Duration::from_millis(self.pg_statement_timeout_ms),
        }
    }

    pub fn resolve(file: FileConfig, overrides: Overrides) -> Result<ServeConfig, ConfigError> {
        let defaults = ServeConfig::default();
        let policy_configs = policy_configs(&file.policies, &overrides.policy_settings)?;
        let config = ServeConfig {
            policy_configs,
            policy_memory_limit_bytes: file
                .policy_memory_limit_bytes
                .unwrap_or(defaults.policy_memory_limit_bytes),
            policy_call_fuel: file.policy_call_fuel.unwrap_or(defaults.policy_call_fuel),
            policy_max_memory_limit_bytes: file
                .policy_max_memory_limit_bytes
                .unwrap_or(defaults.policy_max_memory_limit_bytes),
            policy_max_call_fuel: file
                .policy_max_call_fuel
                .unwrap_or(defaults.policy_max_call_fuel),
            policy_max_faults: file.policy_max_faults.unwrap_or(defaults.policy_max_faults),
            policy_fault_window_ms: file
                .policy_fault_window_ms
                .unwrap_or(defaults.policy_fault_window_ms),
            max_policy_bytes: file.max_policy_bytes.unwrap_or(defaults.max_policy_bytes),
            max_policy_data_bytes: file
                .max_policy_data_bytes
                .unwrap_or(defaults.max_policy_data_bytes),
            lease_ms: overrides
                .lease_ms
                .or(file.lease_ms)
                .unwrap_or(defaults.lease_ms),
            worker_stale_ms: file.worker_stale_ms.unwrap_or(defaults.worker_stale_ms),
            aging_interval_ms: file.aging_interval_ms.unwrap_or(defaults.aging_interval_ms),
            history_interval_ms: file
                .history_interval_ms
                .unwrap_or(defaults.history_interval_ms),
            drain_timeout_ms: overrides
                .drain_timeout_ms
                .or(file.drain_timeout_ms)
                .unwrap_or(defaults.drain_timeout_ms),
            max_claim_wait_ms: file.max_claim_wait_ms.unwrap_or(defaults.max_claim_wait_ms),
            split_kinds: file.split_kinds.unwrap_or(defaults.split_kinds),
            retention_ms: overrides
                .retention_ms
                .or(file.retention_ms)
                .unwrap_or(defaults.retention_ms),
            data_dir: overrides
                .data_dir
                .or(file.data_dir)
                .unwrap_or(defaults.data_dir),
            listen: overrides.listen.or(file.listen).unwrap_or(defaults.listen),
            max_payload_bytes: overrides
                .max_payload_bytes
                .or(file.max_payload_bytes)
                .unwrap_or(defaults.max_payload_bytes),
            max_result_bytes: file.max_result_bytes.unwrap_or(defaults.max_result_bytes),
            callback_allow: overrides
                .callback_allow
                .or(file.callback_allow)
                .unwrap_or(defaults.callback_allow),
            callback_ca_file: overrides.callback_ca_file.or(file.callback_ca_file),
            max_batch_body_bytes: file
                .max_batch_body_bytes
                .unwrap_or(defaults.max_batch_body_bytes),
            inflight_body_bytes: file
                .inflight_body_bytes
                .unwrap_or(defaults.inflight_body_bytes),
            queue_capacity: file.queue_capacity.unwrap_or(defaults.queue_capacity),
            cache_capacity_bytes: file
                .cache_capacity_bytes
                .unwrap_or(defaults.cache_capacity_bytes),
            min_free_disk_bytes: overrides
                .min_free_disk_bytes
                .or(file.min_free_disk_bytes)
                .unwrap_or(defaults.min_free_disk_bytes),
            fdatasync: overrides
                .fdatasync
                .or(file.fdatasync)
                .unwrap_or(defaults.fdatasync),
            sync_claims: overrides
                .sync_claims
                .or(file.sync_claims)
                .unwrap_or(defaults.sync_claims),
            admin_token_sha256: match (&overrides.admin_token, file.admin_token_sha256) {
                (Some(_), Some(_)) => {
                    return Err(ConfigError::Invalid {
                        name: "admin_token_sha256",
                        reason: "set it or SLUICE_ADMIN_TOKEN, not both".into(),
                    });
                }
                (Some(token), None) => Some(crate::auth::token_sha256(token)),
                (None, hash) => hash,
            },
            insecure_no_auth: overrides.insecure_no_auth,
            policy_signing_keys: file.policy_signing_keys.unwrap_or_default(),
            device_rate_per_s: overrides
                .device_rate_per_s
                .or(file.device_rate_per_s)
                .unwrap_or(defaults.device_rate_per_s),
            device_burst: overrides
                .device_burst
                .or(file.device_burst)
                .unwrap_or(defaults.device_burst),
            max_requests_in_flight: file
                .max_requests_in_flight
                .unwrap_or(defaults.max_requests_in_flight),
            request_timeout_ms: file
                .request_timeout_ms
                .unwrap_or(defaults.request_timeout_ms),
            tls_cert: overrides.tls_cert.or(file.tls_cert),
            tls_key: overrides.tls_key.or(file.tls_key),
            store: overrides.store.or(file.store),
            advertise: overrides.advertise.or(file.advertise),
            pg_max_connections: file
                .pg_max_connections
                .unwrap_or(defaults.pg_max_connections),
            pg_acquire_timeout_ms: file
                .pg_acquire_timeout_ms
                .unwrap_or(defaults.pg_acquire_timeout_ms),
            pg_statement_timeout_ms: file
                .pg_statement_timeout_ms
                .unwrap_or(defaults.pg_statement_timeout_ms),
            concurrency_limits: file
                .concurrency_limits
                .unwrap_or_default()
                .into_iter()
                .map(|(key, limit)| sluice_model::ConcurrencyLimit { key, limit })
                .collect(),
            preemption: file.preemption.unwrap_or(defaults.preemption),
            preempt_after_ms: file.preempt_after_ms.unwrap_or(defaults.preempt_after_ms),
            affinity_wait_ms: file.affinity_wait_ms.unwrap_or(defaults.affinity_wait_ms),
        };
        config.check()?;
        Ok(config)
    }

    pub fn check(&self) -> Result<(), ConfigError> {
        let invalid = |name, reason: &str| ConfigError::Invalid {
            name,
            reason: reason.to_owned(),
        };
        if self.retention_ms < 1_000 {
            return Err(invalid("retention_ms", "must be at least 1000 (1 s)"));
        }
        if !(1..=64 * 1024 * 1024).contains(&self.max_payload_bytes) {
            return Err(invalid("max_payload_bytes", "must be 1 B to 64 MiB"));
        }
        if !(1..=64 * 1024 * 1024).contains(&self.max_result_bytes) {
            return Err(invalid("max_result_bytes", "must be 1 B to 64 MiB"));
        }
        if self.callback_allow.len() > 1_000 {
            return Err(invalid("callback_allow", "at most 1,000 rules"));
        }
        if self.concurrency_limits.len() > sluice_model::MAX_CONCURRENCY_LIMITS {
            return Err(invalid("concurrency_limits", "at most 10,000 keys"));
        }
        for limit in &self.concurrency_limits {
            sluice_model::check_concurrency_limit(&limit.key, limit.limit).map_err(|e| {
                ConfigError::Invalid {
                    name: "concurrency_limits",
                    reason: format!("{}: {e}", limit.key),
                }
            })?;
        }
        sluice_model::CallbackAllow::parse(&self.callback_allow)
            .map_err(|reason| invalid("callback_allow", &reason))?;
        if self.max_batch_body_bytes < 1024 || self.max_batch_body_bytes > 256 * 1024 * 1024 {
            return Err(invalid("max_batch_body_bytes", "must be 1 KiB to 256 MiB"));
        }
        let largest_body = self
            .max_batch_body_bytes
            .max(self.max_payload_bytes + 64 * 1024)
            .max(self.max_result_bytes + 64 * 1024)
            .max(self.max_policy_bytes)
            .max(self.max_policy_data_bytes);
        if self.inflight_body_bytes < largest_body || self.inflight_body_bytes > 4 << 30 {
            return Err(invalid(
                "inflight_body_bytes",
                "must hold at least the largest body (batch, single task or policy) and at most 4 GiB",
            ));
        }
        if !(1..=1_000_000).contains(&self.queue_capacity) {
            return Err(invalid("queue_capacity", "must be 1 to 1000000"));
        }
        if self.cache_capacity_bytes < 1024 * 1024 {
            return Err(invalid("cache_capacity_bytes", "must be at least 1 MiB"));
        }
        if !(1 << 20..=1 << 30).contains(&self.policy_memory_limit_bytes) {
            return Err(invalid(
                "policy_memory_limit_bytes",
                "must be 1 MiB to 1 GiB",
            ));
        }
        if !(self.policy_memory_limit_bytes..=4 << 30).contains(&self.policy_max_memory_limit_bytes)
        {
            return Err(invalid(
                "policy_max_memory_limit_bytes",
                "must be at least policy_memory_limit_bytes and at most 4 GiB",
            ));
        }
        if !(self.policy_call_fuel..=100_000_000_000).contains(&self.policy_max_call_fuel) {
            return Err(invalid(
                "policy_max_call_fuel",
                "must be at least policy_call_fuel and at most 100000000000",
            ));
        }
        if !(1_000..=10_000_000_000).contains(&self.policy_call_fuel) {
            return Err(invalid("policy_call_fuel", "must be 1000 to 10000000000"));
        }
        if !(1..=1000).contains(&self.policy_max_faults) {
            return Err(invalid("policy_max_faults", "must be 1 to 1000"));
        }
        if !(1..=86_400_000).contains(&self.policy_fault_window_ms) {
            return Err(invalid("policy_fault_window_ms", "must be 1 ms to 24 h"));
        }
        if !(1024..=1 << 30).contains(&self.max_policy_data_bytes) {
            return Err(invalid("max_policy_data_bytes", "must be 1 KiB to 1 GiB"));
        }
        if !(1024..=256 << 20).contains(&self.max_policy_bytes) {
            return Err(invalid("max_policy_bytes", "must be 1 KiB to 256 MiB"));
        }
        const DAY_MS: u64 = 86_400_000;
        if !(100..=DAY_MS).contains(&self.lease_ms) {
            return Err(invalid("lease_ms", "must be 100 ms to 24 h"));
        }
        if !(100..=DAY_MS).contains(&self.preempt_after_ms) {
            return Err(invalid("preempt_after_ms", "must be 100 ms to 24 h"));
        }
        if self.affinity_wait_ms > DAY_MS {
            return Err(invalid("affinity_wait_ms", "must be 0 ms to 24 h"));
        }
        if !(100..=DAY_MS).contains(&self.worker_stale_ms) {
            return Err(invalid("worker_stale_ms", "must be 100 ms to 24 h"));
        }
        if !(10..=3_600_000).contains(&self.aging_interval_ms) {
            return Err(invalid("aging_interval_ms", "must be 10 ms to 1 h"));
        }
        let history = crate::telemetry::MIN_HISTORY_INTERVAL_MS..=60_000;
        if !history.contains(&self.history_interval_ms) {
            return Err(invalid("history_interval_ms", "must be 100 ms to 1 min"));
        }
        if self.drain_timeout_ms > DAY_MS {
            return Err(invalid("drain_timeout_ms", "must be at most 24 h"));
        }
        if self.max_claim_wait_ms > 300_000 {
            return Err(invalid("max_claim_wait_ms", "must be at most 5 min"));
        }
        if let Some(token) = self.admin_token_sha256.as_deref()
            && (token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(invalid("admin_token_sha256", "must be 64 hex digits"));
        }
        if self.policy_signing_keys.len() > 64 {
            return Err(invalid("policy_signing_keys", "at most 64 keys"));
        }
        crate::auth::signing::SigningKeys::new(&self.policy_signing_keys)
            .map_err(|e| invalid("policy_signing_keys", &e.to_string()))?;
        if !(1..=1_000_000).contains(&self.device_rate_per_s) {
            return Err(invalid("device_rate_per_s", "must be 1 to 1000000"));
        }
        if !(1..=1_000_000).contains(&self.device_burst) {
            return Err(invalid("device_burst", "must be 1 to 1000000"));
        }
        if !(1..=1_000_000).contains(&self.max_requests_in_flight) {
            return Err(invalid("max_requests_in_flight", "must be 1 to 1000000"));
        }
        if self.request_timeout_ms < self.max_claim_wait_ms + 1_000
            || self.request_timeout_ms > 3_600_000
        {
            return Err(invalid(
                "request_timeout_ms",
                "must be at least max_claim_wait_ms + 1000 (a waiting claim must fit) and at most 1 h",
            ));
        }
        if let Some(store) = &self.store
            && !sluice_store_postgres::is_postgres_url(store)
        {
            return Err(invalid(
                "store",
                "must be a postgres:// URL; leave it unset for the embedded store in data_dir",
            ));
        }
        if let Some(advertise) = &self.advertise {
            let port = advertise
                .rsplit_once(':')
                .map(|(_, port)| port.parse::<u16>());
            if advertise.len() > 255 || advertise.contains('/') || !matches!(port, Some(Ok(_))) {
                return Err(invalid(
                    "advertise",
                    "must be host:port, as other replicas reach this one (no scheme, no path)",
                ));
            }
        } else if self.store.is_some() && self.listen.ip().is_unspecified() {
            return Err(invalid(
                "advertise",
                "set it (host:port other replicas reach this one at) when listen is 0.0.0.0 or [::] and the store is PostgreSQL",
            ));
        }
        if !(1..=1_000).contains(&self.pg_max_connections) {
            return Err(invalid("pg_max_connections", "must be 1 to 1000"));
        }
        if !(100..=600_000).contains(&self.pg_acquire_timeout_ms) {
            return Err(invalid("pg_acquire_timeout_ms", "must be 100 ms to 10 min"));
        }
        if !(1_000..=3_600_000).contains(&self.pg_statement_timeout_ms) {
            return Err(invalid("pg_statement_timeout_ms", "must be 1 s to 1 h"));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(invalid("tls_cert", "tls_cert and tls_key go together"));
        }
        if self.split_kinds.len() > 64 {
            return Err(invalid("split_kinds", "at most 64 kinds"));
        }
        if self
            .split_kinds
            .iter()
            .any(|kind| kind.is_empty() || kind.len() > 128)
        {
            return Err(invalid("split_kinds", "each kind is 1 to 128 bytes"));
        }
        Ok(())
    }
}

/// Merges the file's `[policies.<kind>]` tables with `kind.name=value` settings from the
/// command line into one `name=value` text per kind.
fn policy_configs(
    tables: &BTreeMap<String, toml::Table>,
    settings: &[String],
) -> Result<BTreeMap<PolicyKind, String>, ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        name: "policies",
        reason,
    };
    let mut merged: BTreeMap<PolicyKind, BTreeMap<String, String>> = BTreeMap::new();
    for (kind, table) in tables {
        let kind: PolicyKind = kind.parse().map_err(|e| invalid(format!("{e}")))?;
        for (name, value) in table {
            let text = match value {
                toml::Value::String(text) => text.clone(),
                toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => {
                    value.to_string()
                }
                toml::Value::Array(items) => items
                    .iter()
                    .map(|item| match item {
                        toml::Value::String(text) => text.clone(),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(","),
                _ => {
                    return Err(invalid(format!(
                        "[policies.{kind}] {name}: use a string, number, boolean or list"
                    )));
                }
            };
            merged.entry(kind).or_default().insert(name.clone(), text);
        }
    }
    for setting in settings {
        let parsed = setting.split_once('=').and_then(|(path, value)| {
            let (kind, name) = path.split_once('.')?;
            Some((kind, name, value))
        });
        let Some((kind, name, value)) = parsed else {
            return Err(invalid(format!(
                "`{setting}` is not kind.name=value (e.g. retry.initial_delay_ms=100)"
            )));
        };
        let kind: PolicyKind = kind.parse().map_err(|e| invalid(format!("{e}")))?;
        merged
            .entry(kind)
            .or_default()
            .insert(name.to_owned(), value.to_owned());
    }
    let mut configs = BTreeMap::new();
    for (kind, settings) in merged {
        let mut text = String::new();
        for (name, value) in settings {
            let bad = |c: char| c == '\n' || c == '\r';
            if name.is_empty() || name.contains('=') || name.contains(bad) || value.contains(bad) {
                return Err(invalid(format!(
                    "{kind}.{name}: names must be non-empty without `=`; neither may span lines"
                )));
            }
            text.push_str(&name);
            text.push('=');
            text.push_str(&value);
            text.push('\n');
        }
        configs.insert(kind, text);
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let file: FileConfig =
            toml::from_str("listen = \"0.0.0.0:9000\"\ndata_dir = \"/srv/a\"\nqueue_capacity = 10\nsync_claims = true")
                .unwrap();
        let overrides = Overrides {
            data_dir: Some("/srv/b".into()),
            ..Overrides::default()
        };
        let config = ServeConfig::resolve(file, overrides).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/srv/b"));
        assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.queue_capacity, 10);
        assert_eq!(config.max_payload_bytes, 1024 * 1024);
        assert!(config.sync_claims);
        assert!(!ServeConfig::default().sync_claims);
    }

    #[test]
    fn policy_tables_and_flags_become_init_configs() {
        let file: FileConfig = toml::from_str(
            "[policies.retry]\ninitial_delay_ms = 300000\nmax_delay_ms = 1000000\n\n[policies.priority]\nweights = [70, 25, 5]\n",
        )
        .unwrap();
        let overrides = Overrides {
            policy_settings: vec!["retry.initial_delay_ms=100".into()],
            ..Overrides::default()
        };
        let config = ServeConfig::resolve(file, overrides).unwrap();
        assert_eq!(
            config.policy_configs[&PolicyKind::Retry],
            "initial_delay_ms=100\nmax_delay_ms=1000000\n"
        );
        assert_eq!(
            config.policy_configs[&PolicyKind::Priority],
            "weights=70,25,5\n"
        );
        for bad in ["retry", "nope.x=1", "retry.=1", "retry.a=b\nc=d"] {
            let overrides = Overrides {
                policy_settings: vec![bad.into()],
                ..Overrides::default()
            };
            assert!(
                ServeConfig::resolve(FileConfig::default(), overrides).is_err(),
                "{bad}"
            );
        }
        let file: FileConfig = toml::from_str("[policies.sorting]\nx = 1").unwrap();
        assert!(ServeConfig::resolve(file, Overrides::default()).is_err());
    }

    #[test]
    fn postgres_settings_reach_the_store_options() {
        let defaults = ServeConfig::default().pg_options();
        assert_eq!(defaults.max_connections, 16);
        let file: FileConfig = toml::from_str(
            "pg_max_connections = 40\npg_acquire_timeout_ms = 2500\npg_statement_timeout_ms = 120000",
        )
        .unwrap();
        let options = ServeConfig::resolve(file, Overrides::default())
            .unwrap()
            .pg_options();
        assert_eq!(options.max_connections, 40);
        assert_eq!(options.acquire_timeout, Duration::from_millis(2_500));
        assert_eq!(options.statement_timeout, Duration::from_secs(120));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<FileConfig>("listen_addr = \"x\"").is_err());
        let file: FileConfig = toml::from_str("queue_capacity = 0").unwrap();
        assert!(ServeConfig::resolve(file, Overrides::default()).is_err());
        // The body budget must hold the largest policy upload too.
        let file: FileConfig =
            toml::from_str("inflight_body_bytes = 20000000\nmax_policy_bytes = 33554432").unwrap();
        assert!(ServeConfig::resolve(file, Overrides::default()).is_err());
        for bad in [
            "lease_ms = 99",
            "worker_stale_ms = 0",
            "aging_interval_ms = 5",
            "drain_timeout_ms = 86400001",
            "max_claim_wait_ms = 300001",
            "pg_max_connections = 0",
            "pg_acquire_timeout_ms = 99",
            "pg_statement_timeout_ms = 3600001",
        ] {
            let file: FileConfig = toml::from_str(bad).unwrap();
            assert!(
                ServeConfig::resolve(file, Overrides::default()).is_err(),
                "{bad}"
            );
        }
        // The flag overrides the file.
        let file: FileConfig = toml::from_str("lease_ms = 99").unwrap();
        let overrides = Overrides {
            lease_ms: Some(5_000),
            ..Overrides::default()
        };
        assert_eq!(
            ServeConfig::resolve(file, overrides).unwrap().lease_ms,
            5_000
        );
    }
}
