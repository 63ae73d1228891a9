//! The policy registry: validates uploaded components, stores them as versions, and activates,
//! rolls back and restores them, one kind's chain of versions at a time. Decisions go through
//! it (see `decisions`) and never wait for its lock.

use super::conformance::Conformance;
use super::defaults;
use super::instance::{
    AgingInstance, MergeInstance, Policy, PriorityInstance, RetryInstance, SplitInstance,
};
use super::runtime::{Kind, PolicyError, PolicyRuntime};
use super::slot::{Chain, FaultLimit, Loaded, Slot, SlotCounters};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sluice_model::{BUILTIN_VERSION, DataRef, PolicyAction, PolicyEvent, PolicyVersion};
use sluice_store::{PolicyCatalog, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Versions one kind may hold; past it, uploads are refused.
pub const MAX_VERSIONS_PER_KIND: usize = 1000;
/// Activations remembered per kind, for rollback.
const MAX_STACK: usize = 32;
/// Versions in a chain: the active one, its stand-ins, and the built-in one.
const MAX_CHAIN: usize = 3;
/// The longest config a version may carry.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// Policy events shown per kind.
const EVENTS_SHOWN: usize = 100;

/// Which validation step refused an upload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Check {
    Compile,
    Imports,
    World,
    Config,
    Init,
    Conformance,
    /// The upload's signature is missing, malformed, by an unknown key, or does not match.
    Signature,
    /// The memory or fuel asked for is past what the server may grant.
    Grants,
    /// A data blob's name or size is refused.
    Data,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        f.write_str(&name)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("the component failed the {check} check: {detail}")]
    Refused { check: Check, detail: String },
    #[error("the {kind} policy has no version {version}")]
    UnknownVersion { kind: Kind, version: u32 },
    #[error("the {0} policy has no earlier activation to roll back to")]
    NothingToRollBack(Kind),
    #[error("the {kind} policy already has {MAX_VERSIONS_PER_KIND} versions")]
    TooManyVersions { kind: Kind },
    #[error("the built-in {kind} policy cannot start with its config: {source}")]
    Builtin { kind: Kind, source: PolicyError },
    #[error("the {kind} policy version {version} cannot be loaded: {source}")]
    Load {
        kind: Kind,
        version: u32,
        source: PolicyError,
    },
    #[error(
        "version {version} of the {kind} policy has been activated: its data can no longer change; upload a new version"
    )]
    DataOfActivated { kind: Kind, version: u32 },
    #[error("no experiment {0}")]
    UnknownExperiment(u32),
    #[error("{0}")]
    ExperimentRefused(String),
    #[error("{0}")]
    ExperimentConflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn refused(error: PolicyError, during: Check) -> RegistryError {
    let check = match &error {
        PolicyError::Compile(_) => Check::Compile,
        PolicyError::ForbiddenImport(_) => Check::Imports,
        PolicyError::WrongWorld(..) => Check::World,
        _ => during,
    };
    RegistryError::Refused {
        check,
        detail: error.to_string(),
    }
}

#[derive(Clone, Debug)]
pub struct RegistryOptions {
    /// The server's config of each kind (`name=value` lines): the built-in version's, and
    /// that of any upload that brings none of its own.
    pub configs: BTreeMap<Kind, String>,
    pub fault_limit: FaultLimit,
    /// Where each call's latency and faults are counted.
    pub metrics: Arc<super::PolicyMetrics>,
    /// A version's data blobs together may hold this many bytes.
    pub max_data_bytes: usize,
}

/// A version's data by default, all its blobs together.
pub const DEFAULT_MAX_DATA_BYTES: usize = 64 << 20;

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            configs: BTreeMap::new(),
            fault_limit: FaultLimit::default(),
            metrics: Arc::default(),
            max_data_bytes: DEFAULT_MAX_DATA_BYTES,
        }
    }
}

/// Data blobs one version may carry.
pub const MAX_DATA_BLOBS: usize = 16;
/// The longest name of a data blob.
pub const MAX_DATA_NAME_BYTES: usize = 64;

/// What an upload carries beside the component's bytes.
#[derive(Clone, Debug, Default)]
pub struct UploadOptions {
    /// `name=value` lines for `init`; without them, the server's config of the kind.
    pub config: Option<String>,
    /// The id of the key whose signature was checked.
    pub signed_by: Option<String>,
    /// Memory and fuel per call for this version's instances; without them, the defaults.
    pub memory_limit_bytes: Option<u64>,
    pub call_fuel: Option<u64>,
}

/// An upload's outcome: the version, and whether it is new (not the same bytes and config
/// as an existing version).
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Uploaded {
    #[serde(flatten)]
    pub version: PolicyVersion,
    pub created: bool,
}

/// A kind as `GET /v1/policies` shows it.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KindStatus {
    pub kind: Kind,
    pub active_version: u32,
    pub sha256: String,
    pub config: String,
    /// The versions that stand in when the active one faults, in order.
    pub fallback_versions: Vec<u32>,
    #[serde(flatten)]
    pub counters: SlotCounters,
}

/// A kind in full, as `GET /v1/policies/{kind}` shows it.
#[derive(Clone, Debug, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KindDetail {
    #[serde(flatten)]
    pub status: KindStatus,
    /// Versions activated in turn, the active one last; empty means the built-in one.
    pub activations: Vec<u32>,
    pub versions: Vec<PolicyVersion>,
    pub events: Vec<PolicyEvent>,
}

/// The built-in component and config of a kind: version 0.
struct Builtin {
    bytes: &'static [u8],
    sha256: String,
    config: String,
}

pub struct PolicyRegistry {
    runtime: Arc<PolicyRuntime>,
    pub(super) catalog: Arc<dyn PolicyCatalog>,
    options: RegistryOptions,
    pub(super) mutations: Arc<Mutex<()>>,
    builtins: BTreeMap<Kind, Builtin>,
    pub(super) priority: Slot<PriorityInstance>,
    pub(super) aging: Slot<AgingInstance>,
    pub(super) retry: Slot<RetryInstance>,
    pub(super) split: Slot<SplitInstance>,
    pub(super) merge: Slot<MergeInstance>,
    /// The running live experiments, for assigning new tasks without a lock.
    pub(super) live: arc_swap::ArcSwap<Vec<sluice_model::Experiment>>,
    /// The variants' figures of recently ended experiments, newest last (bounded).
    pub(super) ended_figures:
        Mutex<std::collections::VecDeque<(u32, Vec<super::trial::ArmFigures>)>>,
}

/// Runs `$body` with `$slot` bound to the slot of `$kind`.
macro_rules! on_slot {
    ($registry:expr, $kind:expr, $slot:ident => $body:expr) => {
        match $kind {
            ::sluice_model::PolicyKind::Priority => {
                let $slot = &$registry.priority;
                $body
            }
            ::sluice_model::PolicyKind::Aging => {
                let $slot = &$registry.aging;
                $body
            }
            ::sluice_model::PolicyKind::Retry => {
                let $slot = &$registry.retry;
                $body
            }
            ::sluice_model::PolicyKind::Split => {
                let $slot = &$registry.split;
                $body
            }
            ::sluice_model::PolicyKind::Merge => {
                let $slot = &$registry.merge;
                $body
            }
        }
    };
}
pub(super) use on_slot;

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn builtin_bytes(kind: Kind) -> &'static [u8] {
    match kind {
        Kind::Priority => defaults::PRIORITY_BUCKETS,
        Kind::Aging => defaults::AGING_THRESHOLD,
        Kind::Retry => defaults::RETRY_BACKOFF,
        Kind::Split => defaults::SPLIT_SHARDS,
        Kind::Merge => defaults::MERGE_TOPK,
    }
}

impl PolicyRegistry {
    /// Loads the built-in version of every kind with the server's config (refusing to start
    /// when a config is bad), then each kind's activated versions as the catalog holds them.
    pub fn open(
        runtime: Arc<PolicyRuntime>,
        catalog: Arc<dyn PolicyCatalog>,
        options: RegistryOptions,
    ) -> Result<PolicyRegistry, RegistryError> {
        let builtins: BTreeMap<Kind, Builtin> = Kind::ALL
            .into_iter()
            .map(|kind| {
                let bytes = builtin_bytes(kind);
                let builtin = Builtin {
                    bytes,
                    sha256: sha256_hex(bytes),
                    config: options.configs.get(&kind).cloned().unwrap_or_default(),
                };
                (kind, builtin)
            })
            .collect();
        let mutations = Arc::new(Mutex::new(()));
        // The chains are filled in below; until then each slot holds only its built-in version.
        let context = OpenContext {
            runtime: &runtime,
            catalog: &catalog,
            builtins: &builtins,
            limit: options.fault_limit,
            mutations: &mutations,
            metrics: &options.metrics,
        };
        let registry = PolicyRegistry {
            priority: context.slot()?,
            aging: context.slot()?,
            retry: context.slot()?,
            split: context.slot()?,
            merge: context.slot()?,
            runtime,
            catalog,
            options,
            mutations,
            builtins,
            live: Default::default(),
            ended_figures: Default::default(),
        };
        for kind in Kind::ALL {
            let stack = registry.catalog.stack(kind)?;
            on_slot!(registry, kind, slot => registry.install_stack(slot, &stack, true))?;
        }
        registry.resume_experiments()?;
        Ok(registry)
    }

    pub fn runtime(&self) -> &Arc<PolicyRuntime> {
        &self.runtime
    }

    /// Validates `bytes` as a component of `kind` and stores it as the next version. `config`
    /// defaults to the server's config of the kind. The active version is untouched.
    pub fn upload(
        &self,
        kind: Kind,
        bytes: &[u8],
        config: Option<String>,
        now_ms: u64,
    ) -> Result<Uploaded, RegistryError> {
        let options = UploadOptions {
            config,
            ..UploadOptions::default()
        };
        self.upload_with(kind, bytes, options, now_ms)
    }

    /// `upload` with everything an upload may carry: its config, the id of the key whose
    /// signature the caller checked, and the memory and fuel its instances are granted.
    pub fn upload_with(
        &self,
        kind: Kind,
        bytes: &[u8],
        options: UploadOptions,
        now_ms: u64,
    ) -> Result<Uploaded, RegistryError> {
        let UploadOptions {
            config,
            signed_by,
            memory_limit_bytes,
            call_fuel,
        } = options;
        let grants = self
            .runtime
            .grants(memory_limit_bytes, call_fuel)
            .map_err(|detail| RegistryError::Refused {
                check: Check::Grants,
                detail,
            })?;
        let config = config.unwrap_or_else(|| self.builtins[&kind].config.clone());
        if config.len() > MAX_CONFIG_BYTES {
            return Err(RegistryError::Refused {
                check: Check::Config,
                detail: format!("the config is over {MAX_CONFIG_BYTES} bytes"),
            });
        }
        let sha256 = sha256_hex(bytes);
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let versions = self.catalog.versions(kind)?;
        if let Some(existing) = versions.iter().find(|v| {
            v.sha256 == sha256
                && v.config == config
                && v.memory_limit_bytes == memory_limit_bytes
                && v.call_fuel == call_fuel
                && v.data.is_empty()
        }) {
            return Ok(Uploaded {
                version: existing.clone(),
                created: false,
            });
        }
        if versions.len() >= MAX_VERSIONS_PER_KIND {
            return Err(RegistryError::TooManyVersions { kind });
        }
        let compiled = self
            .runtime
            .compile_cached(kind, bytes, &sha256, self.catalog.as_ref())
            .map_err(|e| refused(e, Check::Compile))?
            .with_grants(grants);
        on_slot!(self, kind, slot => self.validate(slot, &compiled, &config))?;
        let version = PolicyVersion {
            kind,
            version: versions.iter().map(|v| v.version).max().unwrap_or(0) + 1,
            sha256,
            config,
            size_bytes: bytes.len() as u64,
            uploaded_at_ms: now_ms,
            signed_by: signed_by.clone(),
            memory_limit_bytes,
            call_fuel,
            data: Vec::new(),
        };
        let event = PolicyEvent {
            seq: 0,
            kind,
            action: PolicyAction::Uploaded,
            version: version.version,
            from: None,
            at_ms: now_ms,
            reason: None,
            signed_by,
        };
        self.catalog.add_version(&version, bytes, event)?;
        tracing::info!(%kind, version = version.version, sha256 = %version.sha256, "policy version stored");
        Ok(Uploaded {
            version,
            created: true,
        })
    }

    /// Stores blob `name` beside `version` of `kind`, once the version inits and passes its
    /// conformance cases with it (and its other blobs). Refused once the version is in the
    /// kind's activation stack: what an active version reads never changes under it.
    pub fn put_data(
        &self,
        kind: Kind,
        version: u32,
        name: &str,
        bytes: &[u8],
    ) -> Result<DataRef, RegistryError> {
        let refuse = |detail: String| RegistryError::Refused {
            check: Check::Data,
            detail,
        };
        let name_ok = !name.is_empty()
            && name.len() <= MAX_DATA_NAME_BYTES
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if !name_ok {
            return Err(refuse(format!(
                "a data name is 1 to {MAX_DATA_NAME_BYTES} ASCII letters, digits, `.`, `_` or `-`"
            )));
        }
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let mut record = self
            .version(kind, version)?
            .ok_or(RegistryError::UnknownVersion { kind, version })?;
        if self.catalog.stack(kind)?.contains(&version) {
            return Err(RegistryError::DataOfActivated { kind, version });
        }
        let blob = DataRef {
            name: name.to_owned(),
            sha256: sha256_hex(bytes),
            size_bytes: bytes.len() as u64,
        };
        record.data.retain(|other| other.name != name);
        record.data.push(blob.clone());
        record.data.sort_by(|a, b| a.name.cmp(&b.name));
        let total: u64 = record.data.iter().map(|d| d.size_bytes).sum();
        if total > self.options.max_data_bytes as u64 {
            return Err(refuse(format!(
                "the version's data would be {total} bytes; at most {} (max_policy_data_bytes)",
                self.options.max_data_bytes
            )));
        }
        if record.data.len() > MAX_DATA_BLOBS {
            return Err(refuse(format!(
                "a version holds at most {MAX_DATA_BLOBS} blobs"
            )));
        }
        let mut data: BTreeMap<String, Arc<[u8]>> = self
            .catalog
            .data(kind, version)?
            .into_iter()
            .map(|(name, bytes)| (name, Arc::from(bytes)))
            .collect();
        data.insert(name.to_owned(), Arc::from(bytes));
        let module = self
            .catalog
            .module(&record.sha256)?
            .ok_or_else(|| RegistryError::Load {
                kind,
                version,
                source: PolicyError::Runtime("its component is missing".into()),
            })?;
        let compiled = self
            .runtime
            .compile_cached(kind, &module, &record.sha256, self.catalog.as_ref())
            .map_err(|e| refused(e, Check::Compile))?
            .with_grants(self.grants_of(&record)?)
            .with_data(Arc::new(data));
        on_slot!(self, kind, slot => self.validate(slot, &compiled, &record.config))?;
        self.catalog.put_data(&record, name, bytes)?;
        tracing::info!(%kind, version, name, size_bytes = blob.size_bytes, "policy data stored");
        Ok(blob)
    }

    /// What a stored version's instances are granted.
    fn grants_of(&self, record: &PolicyVersion) -> Result<super::Grants, RegistryError> {
        self.runtime
            .grants(record.memory_limit_bytes, record.call_fuel)
            .map_err(|reason| RegistryError::Load {
                kind: record.kind,
                version: record.version,
                source: PolicyError::Runtime(format!("its grants: {reason}")),
            })
    }

    /// Init with the config, then the kind's conformance cases, on a fresh instance.
    fn validate<P: Policy + Conformance>(
        &self,
        _slot: &Slot<P>,
        compiled: &super::Compiled,
        config: &str,
    ) -> Result<(), RegistryError> {
        let mut instance = P::instantiate(self.runtime.clone(), compiled, config.as_bytes())
            .map_err(|e| refused(e, Check::Init))?;
        instance
            .conformance()
            .map_err(|detail| RegistryError::Refused {
                check: Check::Conformance,
                detail,
            })
    }

    /// Makes `version` the active one of `kind` (0: the built-in one). Decisions under way
    /// finish on the version they started with; the next ones use `version`.
    pub fn activate(
        &self,
        kind: Kind,
        version: u32,
        now_ms: u64,
    ) -> Result<KindStatus, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        self.activate_locked(kind, version, now_ms, None)?;
        Ok(self.status(kind))
    }

    /// `activate` for a caller holding the registry's lock; `reason` goes in the event.
    pub(super) fn activate_locked(
        &self,
        kind: Kind,
        version: u32,
        now_ms: u64,
        reason: Option<String>,
    ) -> Result<(), RegistryError> {
        let mut stack = self.catalog.stack(kind)?;
        let current = stack.last().copied().unwrap_or(BUILTIN_VERSION);
        if version != current {
            if version != BUILTIN_VERSION && self.version(kind, version)?.is_none() {
                return Err(RegistryError::UnknownVersion { kind, version });
            }
            stack.push(version);
            if stack.len() > MAX_STACK {
                stack.remove(0);
            }
            on_slot!(self, kind, slot => self.install_stack(slot, &stack, false))?;
            self.catalog.set_stack(
                kind,
                &stack,
                PolicyEvent {
                    seq: 0,
                    kind,
                    action: PolicyAction::Activated,
                    version,
                    from: Some(current),
                    at_ms: now_ms,
                    reason,
                    signed_by: None,
                },
            )?;
            tracing::info!(%kind, version, from = current, "policy activated");
        }
        Ok(())
    }

    /// Restores the version active before the current one.
    pub fn rollback(&self, kind: Kind, now_ms: u64) -> Result<KindStatus, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let mut stack = self.catalog.stack(kind)?;
        let Some(current) = stack.pop() else {
            return Err(RegistryError::NothingToRollBack(kind));
        };
        let restored = stack.last().copied().unwrap_or(BUILTIN_VERSION);
        on_slot!(self, kind, slot => self.install_stack(slot, &stack, false))?;
        self.catalog.set_stack(
            kind,
            &stack,
            PolicyEvent {
                seq: 0,
                kind,
                action: PolicyAction::RolledBack,
                version: restored,
                from: Some(current),
                at_ms: now_ms,
                reason: None,
                signed_by: None,
            },
        )?;
        tracing::info!(%kind, version = restored, from = current, "policy rolled back");
        Ok(self.status(kind))
    }

    pub(super) fn version(
        &self,
        kind: Kind,
        version: u32,
    ) -> Result<Option<PolicyVersion>, RegistryError> {
        Ok(self
            .catalog
            .versions(kind)?
            .into_iter()
            .find(|v| v.version == version))
    }

    /// Builds and installs the chain for `stack`: its newest distinct versions, then the
    /// built-in one. Versions already loaded are reused with their instances. The active
    /// version must load; a stand-in that does not is left out (and logged), or, at start
    /// (`lenient`), so is an active one, so that a bad record cannot stop the server.
    fn install_stack<P: Policy>(
        &self,
        slot: &Slot<P>,
        stack: &[u32],
        lenient: bool,
    ) -> Result<(), RegistryError> {
        let current = slot.chain();
        let builtin = current
            .links
            .last()
            .cloned()
            .ok_or_else(|| StoreError::Corrupt {
                what: "policy chain",
                detail: "empty".into(),
            })?;
        let mut links: Vec<Arc<Loaded<P>>> = Vec::new();
        for (depth, &version) in stack.iter().rev().enumerate() {
            if links.len() + 1 >= MAX_CHAIN || version == BUILTIN_VERSION {
                break;
            }
            if links.iter().any(|l| l.version == version) {
                continue;
            }
            let reused = current.links.iter().find(|l| l.version == version).cloned();
            let loaded = match reused {
                Some(loaded) => Ok(loaded),
                None => self.load::<P>(version).map(Arc::new),
            };
            match loaded {
                Ok(loaded) => links.push(loaded),
                Err(error) if depth > 0 || lenient => {
                    tracing::error!(%error, kind = %P::KIND, version, "policy version left out of its chain");
                }
                Err(error) => return Err(error),
            }
        }
        links.push(builtin);
        slot.install(Chain { links });
        Ok(())
    }

    pub(super) fn load<P: Policy>(&self, version: u32) -> Result<Loaded<P>, RegistryError> {
        let kind = P::KIND;
        let load_error = |source| RegistryError::Load {
            kind,
            version,
            source,
        };
        let record = self
            .version(kind, version)?
            .ok_or(RegistryError::UnknownVersion { kind, version })?;
        let bytes = self
            .catalog
            .module(&record.sha256)?
            .ok_or_else(|| load_error(PolicyError::Runtime("its component is missing".into())))?;
        let grants = self.grants_of(&record)?;
        let data: BTreeMap<String, Arc<[u8]>> = if record.data.is_empty() {
            BTreeMap::new()
        } else {
            self.catalog
                .data(kind, version)?
                .into_iter()
                .map(|(name, bytes)| (name, Arc::from(bytes)))
                .collect()
        };
        let compiled = self
            .runtime
            .compile_cached(kind, &bytes, &record.sha256, self.catalog.as_ref())
            .map_err(load_error)?
            .with_grants(grants)
            .with_data(Arc::new(data));
        Loaded::new(
            self.runtime.clone(),
            version,
            record.sha256,
            record.config.into_bytes(),
            Arc::new(compiled),
        )
        .map_err(load_error)
    }

    pub fn status(&self, kind: Kind) -> KindStatus {
        on_slot!(self, kind, slot => status_of(slot))
    }

    pub fn list(&self) -> Vec<KindStatus> {
        Kind::ALL
            .into_iter()
            .map(|kind| self.status(kind))
            .collect()
    }

    pub fn detail(&self, kind: Kind) -> Result<KindDetail, RegistryError> {
        Ok(KindDetail {
            status: self.status(kind),
            activations: self.catalog.stack(kind)?,
            versions: self.catalog.versions(kind)?,
            events: self.catalog.events(kind, EVENTS_SHOWN)?,
        })
    }

    /// The built-in component of `kind`, as embedded in this binary.
    pub fn builtin_component(&self, kind: Kind) -> &'static [u8] {
        self.builtins[&kind].bytes
    }

    pub fn options(&self) -> &RegistryOptions {
        &self.options
    }
}

fn status_of<P: Policy>(slot: &Slot<P>) -> KindStatus {
    let chain = slot.chain();
    let active = chain.active();
    KindStatus {
        kind: P::KIND,
        active_version: active.version,
        sha256: active.sha256.clone(),
        config: String::from_utf8_lossy(&active.config).into_owned(),
        fallback_versions: chain.links[1..].iter().map(|l| l.version).collect(),
        counters: slot.counters(),
    }
}

/// What building the slots at start needs.
struct OpenContext<'a> {
    runtime: &'a Arc<PolicyRuntime>,
    catalog: &'a Arc<dyn PolicyCatalog>,
    builtins: &'a BTreeMap<Kind, Builtin>,
    limit: FaultLimit,
    mutations: &'a Arc<Mutex<()>>,
    metrics: &'a Arc<super::PolicyMetrics>,
}

impl OpenContext<'_> {
    /// A slot holding only the built-in version, which must init and pass conformance with
    /// the server's config.
    fn slot<P: Policy + Conformance>(&self) -> Result<Slot<P>, RegistryError> {
        let kind = P::KIND;
        let builtin = &self.builtins[&kind];
        let error = |source| RegistryError::Builtin { kind, source };
        let compiled = self
            .runtime
            .compile_cached(kind, builtin.bytes, &builtin.sha256, self.catalog.as_ref())
            .map_err(error)?;
        let loaded = Loaded::<P>::new(
            self.runtime.clone(),
            BUILTIN_VERSION,
            builtin.sha256.clone(),
            builtin.config.clone().into_bytes(),
            Arc::new(compiled),
        )
        .map_err(error)?;
        loaded
            .instance()
            .map_err(error)?
            .conformance()
            .map_err(|detail| error(PolicyError::Conformance(detail)))?;
        Ok(Slot::new(
            Chain {
                links: vec![Arc::new(loaded)],
            },
            self.limit,
            self.catalog.clone(),
            self.mutations.clone(),
            self.metrics.clone(),
        ))
    }
}
