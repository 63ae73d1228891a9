//! Server configuration: each setting declared once (`settings!` below: name, type, default,
//! check, doc), read from defaults, then a TOML file, then `SLUICE_*` environment variables,
//! then flags. The command builds the flags and variables from `ServeConfig::settings()`, and
//! the README's table is generated from it (`settings_table`, held to the README by a test).

mod setting;
#[cfg(test)]
mod tests;

pub use setting::SettingInfo;
use setting::{any, settings, within};

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
    #[error(
        "unknown setting `{0}` in the config file; the settings are listed in the README's Configuration table"
    )]
    Unknown(String),
}

const DAY_MS: u64 = 86_400_000;
const MIB: usize = 1 << 20;

fn postgres_url(store: &Option<String>) -> Result<(), String> {
    match store {
        Some(url) if !sluice_store_postgres::is_postgres_url(url) => Err(
            "must be a postgres:// URL; leave it unset for the embedded store in data_dir"
                .to_owned(),
        ),
        _ => Ok(()),
    }
}

fn host_port(advertise: &Option<String>) -> Result<(), String> {
    let Some(advertise) = advertise else {
        return Ok(());
    };
    let port = advertise
        .rsplit_once(':')
        .map(|(_, port)| port.parse::<u16>());
    if advertise.len() > 255 || advertise.contains('/') || !matches!(port, Some(Ok(_))) {
        return Err(
            "must be host:port, as other replicas reach this one (no scheme, no path)".to_owned(),
        );
    }
    Ok(())
}

fn hex_sha256(hash: &Option<String>) -> Result<(), String> {
    match hash {
        Some(hash) if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Err("must be 64 hex digits".to_owned())
        }
        _ => Ok(()),
    }
}

// A check takes a reference to its setting's own type.
#[allow(clippy::ptr_arg)]
fn callback_rules(rules: &Vec<String>) -> Result<(), String> {
    if rules.len() > 1_000 {
        return Err("at most 1,000 rules".to_owned());
    }
    sluice_model::CallbackAllow::parse(rules).map(|_| ())
}

/// Each bucket's `batch_wait_ms` from `urgent=0,normal=10000,low=10000`; a bucket not named
/// keeps the engine's default.
pub fn bucket_batch_waits(items: &[String]) -> Result<[u64; 3], String> {
    let mut waits = sluice_engine::DEFAULT_BATCH_WAIT_MS;
    let max = sluice_engine::MAX_BATCH_WAIT_MS;
    let mut named = [false; 3];
    for item in items {
        let (bucket, ms) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}` is not bucket=ms (e.g. urgent=0)"))?;
        let bucket = sluice_model::Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == bucket.trim())
            .ok_or_else(|| format!("`{bucket}` is not a bucket: urgent, normal or low"))?;
        let ms: u64 = ms
            .trim()
            .parse()
            .map_err(|_| format!("`{ms}` in `{item}` is not a whole number of ms"))?;
        if ms > max {
            return Err(format!("`{item}`: at most {max} ms"));
        }
        if std::mem::replace(&mut named[bucket.index()], true) {
            return Err(format!("`{}` is named twice", bucket.as_str()));
        }
        waits[bucket.index()] = ms;
    }
    Ok(waits)
}

#[allow(clippy::ptr_arg)]
fn batch_waits(items: &Vec<String>) -> Result<(), String> {
    bucket_batch_waits(items).map(|_| ())
}

#[allow(clippy::ptr_arg)]
fn kinds(kinds: &Vec<String>) -> Result<(), String> {
    if kinds.len() > 64 {
        return Err("at most 64 kinds".to_owned());
    }
    if kinds.iter().any(|kind| kind.is_empty() || kind.len() > 128) {
        return Err("each kind is 1 to 128 bytes".to_owned());
    }
    Ok(())
}

settings! {
    /// Where the embedded store (sled) keeps the state
    data_dir: PathBuf = PathBuf::from("./sluice-data"), any;
    /// A postgres:// URL: keep the state there, shared by replicas
    /// (instead of sled in data_dir)
    store: Option<String> = None, postgres_url;
    /// host:port the other replicas reach this one at, with a PostgreSQL store
    /// (none: the bound listen address)
    advertise: Option<String> = None, host_port;
    /// On PostgreSQL: the shared pool's connections
    /// (for reads, retention and the catalog; the engine has 5 more)
    pg_max_connections: u32 = 16, within(1..=1_000, "1 to 1000");
    /// On PostgreSQL: how long a call waits for a connection
    pg_acquire_timeout_ms: u64 = 5_000, within(100..=600_000, "100 ms to 10 min");
    /// On PostgreSQL: the longest one statement may run
    pg_statement_timeout_ms: u64 = 30_000, within(1_000..=3_600_000, "1 s to 1 h");
    /// Address to listen on; port 0 picks a free port
    listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 7700)), any;
    /// Largest task payload accepted
    max_payload_bytes: usize = MIB, within(1..=64 * MIB, "1 B to 64 MiB");
    /// Largest `result` a complete report may carry
    /// (413 `result-too-large` past it)
    max_result_bytes: usize = MIB, within(1..=64 * MIB, "1 B to 64 MiB");
    /// fdatasync after each group flush, so acknowledged tasks survive power loss
    fdatasync: bool = true, any;
    /// Answer a claim once its leases are synced
    /// (not once they are written to the log; see Operations)
    sync_claims: bool = false, any;
    /// Private hosts, addresses or CIDRs a callback_url may name
    /// (loopback, private and link-local ones are refused otherwise)
    callback_allow: Vec<String> = Vec::new(), callback_rules;
    /// Extra CA certificates (PEM) for https callbacks
    /// (beside the system's roots)
    callback_ca_file: Option<PathBuf> = None, any;
    /// Largest body of a batch submission
    max_batch_body_bytes: usize = 16 * MIB, within(1024..=256 * MIB, "1 KiB to 256 MiB");
    /// Requests waiting for the writer; past it, 503 `overloaded`
    queue_capacity: usize = 4096, within(1..=1_000_000, "1 to 1000000");
    /// Request bodies held in memory at once; past it, 503
    inflight_body_bytes: usize = 256 * MIB, any;
    /// sled's page cache, in bytes
    cache_capacity_bytes: u64 = 512 << 20, within(1 << 20..=u64::MAX, "at least 1 MiB");
    /// Free disk kept in reserve; below it writes get 507
    /// (on the data directory's filesystem, until space is freed)
    min_free_disk_bytes: u64 = sluice_store::DEFAULT_MIN_FREE_DISK_BYTES, any;
    /// Memory of one policy instance
    policy_memory_limit_bytes: usize = 16 * MIB, within(MIB..=1024 * MIB, "1 MiB to 1 GiB");
    /// Fuel of one policy call
    policy_call_fuel: u64 = 50_000_000, within(1_000..=10_000_000_000, "1000 to 10000000000");
    /// The most memory an upload may grant its version
    /// (`sluice policy upload --memory-limit`)
    policy_max_memory_limit_bytes: usize = 256 * MIB, any;
    /// The most fuel an upload may grant its version
    /// (`sluice policy upload --fuel`)
    policy_max_call_fuel: u64 = 10_000_000_000, any;
    /// Faults in policy_fault_window_ms that retire a policy version
    policy_max_faults: u32 = 5, within(1..=1_000, "1 to 1000");
    /// The window policy_max_faults counts in
    policy_fault_window_ms: u64 = 60_000, within(1..=DAY_MS, "1 ms to 24 h");
    /// Largest policy component an upload may carry
    /// (a Python policy is about 18 MiB)
    max_policy_bytes: usize = 32 * MIB, within(1024..=256 * MIB, "1 KiB to 256 MiB");
    /// A policy version's data blobs, all together
    max_policy_data_bytes: usize = sluice_policy_runtime::DEFAULT_MAX_DATA_BYTES,
        within(1024..=1024 * MIB, "1 KiB to 1 GiB");
    /// How long a claim or a lease heartbeat holds a task
    lease_ms: u64 = 30_000, within(100..=DAY_MS, "100 ms to 24 h");
    /// On SIGTERM or SIGINT, how long running work may still report
    drain_timeout_ms: u64 = 90_000, within(0..=DAY_MS, "at most 24 h");
    /// A worker whose last heartbeat is older gets no tasks
    worker_stale_ms: u64 = 30_000, within(100..=DAY_MS, "100 ms to 24 h");
    /// How often the aging policy looks at the waiting tasks
    aging_interval_ms: u64 = 1_000, within(10..=3_600_000, "10 ms to 1 h");
    /// One sample of the status page's 15-minute charts
    history_interval_ms: u64 = crate::telemetry::DEFAULT_HISTORY_INTERVAL_MS,
        within(crate::telemetry::MIN_HISTORY_INTERVAL_MS..=60_000, "100 ms to 1 min");
    /// The longest `wait_ms` a claim may ask
    max_claim_wait_ms: u64 = 30_000, within(0..=300_000, "at most 5 min");
    /// How long ended tasks are kept after their last change
    /// (with their payloads, keys and events; not while a callback is still due)
    retention_ms: u64 = crate::scheduler::DEFAULT_RETENTION_MS,
        within(1_000..=u64::MAX, "at least 1000 (1 s)");
    /// Let a waiting urgent task stop a lower attempt
    /// (after preempt_after_ms with every fitting GPU busy; see docs/dispatch.md)
    preemption: bool = false, any;
    /// How long an urgent task waits before it may preempt
    preempt_after_ms: u64 = 5_000, within(100..=DAY_MS, "100 ms to 24 h");
    /// How long a task waits for a worker with its model loaded
    affinity_wait_ms: u64 = 10_000, within(0..=DAY_MS, "0 ms to 24 h");
    /// The longest a task waits in each bucket for a GPU batch to fill
    /// (a batch claim's own max_wait_ms may be shorter; urgent=0 never holds urgent work back;
    /// a bucket left out keeps its default)
    batch_wait_ms: Vec<String> = vec!["urgent=0".to_owned(), "normal=10000".to_owned(), "low=10000".to_owned()],
        batch_waits;
    /// Task kinds split on admission and merged, comma-separated
    split_kinds: Vec<String> = vec!["vector.search".to_owned()], kinds;
    /// The bootstrap admin token's hex SHA-256
    /// (or the token itself in SLUICE_ADMIN_TOKEN)
    admin_token_sha256: Option<String> = None, hex_sha256;
    /// A PEM certificate chain: serve https with it and tls_key; SIGHUP reloads both
    tls_cert: Option<PathBuf> = None, any;
    /// The PEM private key of tls_cert
    tls_key: Option<PathBuf> = None, any;
    /// Each device token's request rate; past it and the burst, 429
    device_rate_per_s: u32 = 100, within(1..=1_000_000, "1 to 1000000");
    /// How many requests a device token may send at once above its rate
    device_burst: u32 = 200, within(1..=1_000_000, "1 to 1000000");
    /// Requests answered at once (waiting claims count); past it, 503
    max_requests_in_flight: usize = 4096, within(1..=1_000_000, "1 to 1000000");
    /// The longest a request may take to its answer
    /// (at least max_claim_wait_ms + 1000)
    request_timeout_ms: u64 = 60_000, any;
    ;;
    /// Each policy kind's settings, as the `name=value` lines its component's `init` takes
    /// (`[policies.<kind>]` tables and `--policy-config kind.name=value`).
    policy_configs: BTreeMap<PolicyKind, String> = BTreeMap::new();
    /// The ed25519 keys policy uploads must be signed by (`policy_signing_keys = [{ id,
    /// public_key }]` in the file); none: no signature asked.
    policy_signing_keys: Vec<crate::auth::signing::KeyConfig> = Vec::new();
    /// Limits on tasks leased at once per concurrency key or key prefix ending in `*`
    /// (`[concurrency_limits]` in the file); those set through the API override these.
    concurrency_limits: Vec<sluice_model::ConcurrencyLimit> = Vec::new();
    /// Serve without auth even on a non-loopback address (`--insecure-no-auth` only; warned at
    /// every start).
    insecure_no_auth: bool = false;
}

/// The file keys that are tables or lists of tables rather than settings of one value.
const TABLE_KEYS: [&str; 3] = ["policies", "policy_signing_keys", "concurrency_limits"];

/// A parsed config file: its keys are checked against the settings when it is resolved.
#[derive(Debug, Default)]
pub struct FileConfig {
    table: toml::Table,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        FileConfig::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })
    }

    pub fn parse(text: &str) -> Result<FileConfig, toml::de::Error> {
        Ok(FileConfig {
            table: toml::from_str(text)?,
        })
    }
}

/// What the command line and the environment give, each overriding the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// Settings by name (`lease_ms`), as the text of their flag or variable.
    pub given: Vec<(String, String)>,
    /// `kind.name=value` settings of policies; each overrides the same setting in the file.
    pub policy_settings: Vec<String>,
    /// The bootstrap admin token's text (`SLUICE_ADMIN_TOKEN`); only its hash is kept.
    pub admin_token: Option<String>,
    pub insecure_no_auth: bool,
}

impl Overrides {
    /// One setting given by name, for tests and embedding programs.
    pub fn with(mut self, name: &str, text: &str) -> Overrides {
        self.given.push((name.to_owned(), text.to_owned()));
        self
    }
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

    /// The settings in effect, as a config file (`sluice serve --check-config` prints it); a
    /// PostgreSQL URL's password is masked.
    pub fn effective_toml(&self) -> String {
        let mut table = self.to_table();
        if let Some(url) = &self.store {
            table.insert(
                "store".to_owned(),
                toml::Value::String(sluice_store_postgres::redacted(url)),
            );
        }
        toml::to_string(&table).unwrap_or_default()
    }

    /// Defaults, then the file, then the overrides; then every check.
    pub fn resolve(file: FileConfig, overrides: Overrides) -> Result<ServeConfig, ConfigError> {
        let mut config = ServeConfig::default();
        let mut tables = BTreeMap::new();
        for (key, value) in file.table {
            if TABLE_KEYS.contains(&key.as_str()) {
                tables.insert(key, value);
            } else if !config.set_toml(&key, value)? {
                return Err(ConfigError::Unknown(key));
            }
        }
        for (name, text) in &overrides.given {
            if !config.set_text(name, text)? {
                return Err(ConfigError::Unknown(name.clone()));
            }
        }
        config.read_tables(tables, &overrides.policy_settings)?;
        if let Some(token) = &overrides.admin_token {
            if config.admin_token_sha256.is_some() {
                return Err(ConfigError::Invalid {
                    name: "admin_token_sha256",
                    reason: "set it or SLUICE_ADMIN_TOKEN, not both".into(),
                });
            }
            config.admin_token_sha256 = Some(crate::auth::token_sha256(token));
        }
        config.insecure_no_auth = overrides.insecure_no_auth;
        config.check()?;
        Ok(config)
    }

    fn read_tables(
        &mut self,
        mut tables: BTreeMap<String, toml::Value>,
        policy_settings: &[String],
    ) -> Result<(), ConfigError> {
        let invalid = |name: &'static str, reason: String| ConfigError::Invalid { name, reason };
        let policies: BTreeMap<String, toml::Table> = match tables.remove("policies") {
            Some(value) => value
                .try_into()
                .map_err(|e| invalid("policies", format!("{e}")))?,
            None => BTreeMap::new(),
        };
        self.policy_configs = policy_configs(&policies, policy_settings)?;
        if let Some(value) = tables.remove("policy_signing_keys") {
            self.policy_signing_keys = value
                .try_into()
                .map_err(|e| invalid("policy_signing_keys", format!("{e}")))?;
        }
        if let Some(value) = tables.remove("concurrency_limits") {
            let limits: BTreeMap<String, u32> = value
                .try_into()
                .map_err(|e| invalid("concurrency_limits", format!("{e}")))?;
            self.concurrency_limits = limits
                .into_iter()
                .map(|(key, limit)| sluice_model::ConcurrencyLimit { key, limit })
                .collect();
        }
        Ok(())
    }

    /// Each setting's own check, then those that hold between settings.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_each()?;
        let invalid = |name, reason: &str| ConfigError::Invalid {
            name,
            reason: reason.to_owned(),
        };
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
        if self.policy_signing_keys.len() > 64 {
            return Err(invalid("policy_signing_keys", "at most 64 keys"));
        }
        crate::auth::signing::SigningKeys::new(&self.policy_signing_keys)
            .map_err(|e| invalid("policy_signing_keys", &e.to_string()))?;
        if self.request_timeout_ms < self.max_claim_wait_ms + 1_000
            || self.request_timeout_ms > 3_600_000
        {
            return Err(invalid(
                "request_timeout_ms",
                "must be at least max_claim_wait_ms + 1000 (a waiting claim must fit) and at most 1 h",
            ));
        }
        if self.advertise.is_none() && self.store.is_some() && self.listen.ip().is_unspecified() {
            return Err(invalid(
                "advertise",
                "set it (host:port other replicas reach this one at) when listen is 0.0.0.0 or [::] and the store is PostgreSQL",
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Err(invalid("tls_cert", "tls_cert and tls_key go together"));
        }
        Ok(())
    }
}

/// The README's table of settings, generated from their declarations.
pub fn settings_table() -> String {
    let mut out = String::from("| setting | default | what it is |\n|---|---|---|\n");
    for setting in ServeConfig::settings() {
        let default = match setting.default_text.as_str() {
            "none" => "none".to_owned(),
            text => format!("`{text}`"),
        };
        out.push_str(&format!(
            "| `{}` | {default} | {} |\n",
            setting.name,
            setting.summary()
        ));
    }
    out
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
