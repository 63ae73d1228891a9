//! Compiling, checking and instantiating policy components: one engine, fuel as the bound on
//! each call's work, the pooling allocator with a memory cap per instance, and an import
//! allowlist.
//!
//! The bound is fuel (wasm work done), not a wall-clock deadline: a deadline also counts the
//! time the calling thread is preempted, so on a busy machine it faults good calls (seen here
//! with 4 deciding threads on 2 cores). Fuel faults the same call on every run, which keeps
//! decisions replayable.

use super::refusals;
use super::wasi::{self, HasWasi, WasiState};
use sluice_store::PolicyCatalog;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

pub use sluice_model::PolicyKind as Kind;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// What the bytes are instead, in one line.
    #[error("{0}")]
    Compile(String),
    #[error("imports {}, which policies are not granted", .0.join(", "))]
    ForbiddenImport(Vec<String>),
    /// The kind asked for, and what the component is instead.
    #[error("{1}")]
    WrongWorld(Kind, String),
    #[error("init refused its config: {0}")]
    Init(String),
    #[error("faulted: {0}")]
    Fault(String),
    #[error("answered something the host cannot use: {0}")]
    BadAnswer(String),
    #[error("failed a conformance case: {0}")]
    Conformance(String),
    #[error("policy runtime failure: {0}")]
    Runtime(String),
}

#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// An instance's memory cap, unless its version was uploaded with one of its own.
    pub memory_limit_bytes: usize,
    /// Fuel one call may burn; about one unit per wasm instruction. The default, 50 million,
    /// is about 10 ms of a tight loop where it was measured (the `spin` test policy burns 10
    /// million in 1.6-2 ms).
    pub call_fuel: u64,
    /// The most a version may be granted at upload (`memory_limit_bytes`, `call_fuel`): the
    /// pool reserves this much address space per instance.
    pub max_memory_limit_bytes: usize,
    pub max_call_fuel: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            memory_limit_bytes: 16 << 20,
            call_fuel: 50_000_000,
            max_memory_limit_bytes: 256 << 20,
            max_call_fuel: 10_000_000_000,
        }
    }
}

/// What one version's instances may use: memory, and fuel per call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grants {
    pub memory_limit_bytes: usize,
    pub call_fuel: u64,
}

/// A version's data blobs by name (see the `data` interface in `wit/policy.wit`).
pub type PolicyData = std::sync::Arc<std::collections::BTreeMap<String, std::sync::Arc<[u8]>>>;

/// The interface a policy reads its version's data through.
const DATA_INTERFACE: &str = "sluice:policy/data@0.1.0";

/// What a policy instance's `Store` holds: its memory cap, its fuel per call, and its
/// version's data. Policies are granted nothing else.
pub struct Sandbox {
    limits: wasmtime::StoreLimits,
    call_fuel: u64,
    data: PolicyData,
    wasi: WasiState,
}

impl HasWasi for Sandbox {
    fn wasi(&mut self) -> &mut WasiState {
        &mut self.wasi
    }
}

impl Sandbox {
    /// The end of what the instance wrote to standard output or error, for a fault message.
    pub fn output_tail(&self) -> String {
        self.wasi.output_tail()
    }
}

/// What a policy may import: the policy package's own interfaces, and the WASI interfaces a
/// std or interpreted guest imports, each either answered by the virtual WASI (`wasi.rs`: a
/// frozen clock, seeded random bits, no environment, no preopened directory) or linked as
/// traps (calling one ends the call). Nothing here reaches a real file, socket, clock or
/// entropy source; anything else, `wasi:http` say, is refused.
const ALLOWED_IMPORT_PREFIXES: [&str; 17] = [
    "sluice:policy/types@",
    "sluice:policy/names@",
    "sluice:policy/data@",
    "wasi:io/",
    "wasi:cli/environment@",
    "wasi:cli/exit@",
    "wasi:cli/stdin@",
    "wasi:cli/stdout@",
    "wasi:cli/stderr@",
    "wasi:cli/terminal-",
    "wasi:clocks/monotonic-clock@",
    "wasi:clocks/wall-clock@",
    "wasi:random/random@",
    "wasi:random/insecure@",
    "wasi:random/insecure-seed@",
    "wasi:filesystem/",
    "wasi:sockets/",
];

pub struct PolicyRuntime {
    engine: Engine,
    options: RuntimeOptions,
    /// Names this engine's code-generation settings in the compiled-code cache, so code
    /// compiled by another wasmtime or with other settings is never looked up.
    cache_tag: u64,
}

/// A compiled component of one kind, ready to instantiate cheaply, with what its instances
/// are granted.
pub struct Compiled {
    pub kind: Kind,
    pub pre: InstancePre<Sandbox>,
    pub grants: Grants,
    pub data: PolicyData,
}

impl Compiled {
    /// The same code, for a version with other grants.
    pub fn with_grants(mut self, grants: Grants) -> Compiled {
        self.grants = grants;
        self
    }

    /// The same code, for a version with this data.
    pub fn with_data(mut self, data: PolicyData) -> Compiled {
        self.data = data;
        self
    }
}

impl PolicyRuntime {
    pub fn new(options: RuntimeOptions) -> Result<PolicyRuntime, PolicyError> {
        let runtime = |e: wasmtime::Error| PolicyError::Runtime(e.to_string());
        let mut pooling = PoolingAllocationConfig::default();
        // The pool's cap is the largest grant; each store's limiter holds it to its own.
        pooling.max_memory_size(
            options
                .max_memory_limit_bytes
                .max(options.memory_limit_bytes),
        );
        pooling.total_component_instances(256);
        pooling.total_core_instances(1024);
        pooling.total_memories(512);
        pooling.total_tables(512);
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(true);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config).map_err(runtime)?;
        let cache_tag = {
            use std::hash::{Hash, Hasher};
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut hasher);
            hasher.finish()
        };
        Ok(PolicyRuntime {
            engine,
            options,
            cache_tag,
        })
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// Compiles `bytes` as a component of `kind`: it must be a component, import only what
    /// the allowlist grants, and export its kind's world.
    pub fn compile(&self, kind: Kind, bytes: &[u8]) -> Result<Compiled, PolicyError> {
        let component = self.component(bytes)?;
        self.prepare(kind, component)
    }

    /// The bytes compiled, or a one-line refusal saying what they are instead.
    fn component(&self, bytes: &[u8]) -> Result<Component, PolicyError> {
        if let Some(what) = refusals::not_a_component(bytes) {
            return Err(PolicyError::Compile(what));
        }
        Component::new(&self.engine, bytes).map_err(|e| {
            PolicyError::Compile(format!(
                "not a valid component: {}",
                refusals::one_line(&format!("{e:#}"))
            ))
        })
    }

    /// Like `compile`, but takes the machine code from `cache` when an earlier compile of the
    /// same bytes by an engine like this one left it there, and leaves it there otherwise.
    pub fn compile_cached(
        &self,
        kind: Kind,
        bytes: &[u8],
        sha256: &str,
        cache: &dyn PolicyCatalog,
    ) -> Result<Compiled, PolicyError> {
        let key = format!("{sha256}-{:016x}", self.cache_tag);
        match cache.compiled(&key) {
            Ok(Some(code)) => {
                // SAFETY: wasmtime requires that the bytes come from `Component::serialize` of
                // a compatible engine. The cache is only ever written below, with the output
                // of `serialize`, under a key naming this engine's settings; the store checksums
                // what it stores, and wasmtime checks the version and settings again.
                match unsafe { Component::deserialize(&self.engine, &code) } {
                    Ok(component) => return self.prepare(kind, component),
                    Err(error) => tracing::warn!(%error, sha256, "discarding cached policy code"),
                }
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, sha256, "cannot read the policy code cache"),
        }
        let component = self.component(bytes)?;
        let compiled = self.prepare(kind, component.clone())?;
        match component.serialize() {
            Ok(code) => {
                if let Err(error) = cache.put_compiled(&key, &code) {
                    tracing::warn!(%error, sha256, "cannot cache compiled policy code");
                }
            }
            Err(error) => tracing::warn!(%error, sha256, "cannot serialize compiled policy code"),
        }
        Ok(compiled)
    }

    /// Checks a compiled component's imports and world, and links it.
    fn prepare(&self, kind: Kind, component: Component) -> Result<Compiled, PolicyError> {
        let imports: Vec<String> = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name.to_owned())
            .collect();
        let forbidden: Vec<String> = imports
            .iter()
            .inspect(|name| tracing::debug!(import = name, ?kind, "checking a policy import"))
            .filter(|name| !ALLOWED_IMPORT_PREFIXES.iter().any(|p| name.starts_with(p)))
            .cloned()
            .collect();
        if !forbidden.is_empty() {
            return Err(PolicyError::ForbiddenImport(forbidden));
        }
        let mut linker = Linker::new(&self.engine);
        wasi::define_for(&mut linker, &self.engine, &component)
            .map_err(|e| PolicyError::Runtime(format!("{e:#}")))?;
        linker
            .instance(DATA_INTERFACE)
            .and_then(|mut data| {
                data.func_wrap(
                    "get",
                    |store: wasmtime::StoreContextMut<'_, Sandbox>, (name,): (String,)| {
                        let blob = store.data().data.get(&name).map(|blob| blob.to_vec());
                        Ok((blob,))
                    },
                )
            })
            .map_err(|e| PolicyError::Runtime(e.to_string()))?;
        linker
            .define_unknown_imports_as_traps(&component)
            .map_err(|e| PolicyError::Runtime(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| PolicyError::Runtime(format!("{e:#}")))?;
        let compiled = Compiled {
            kind,
            pre,
            grants: self.default_grants(),
            data: PolicyData::default(),
        };
        compiled.check_world()?;
        Ok(compiled)
    }

    /// What a version gets unless it was uploaded with grants of its own.
    pub fn default_grants(&self) -> Grants {
        Grants {
            memory_limit_bytes: self.options.memory_limit_bytes,
            call_fuel: self.options.call_fuel,
        }
    }

    /// Grants an upload asked for, each defaulted and checked against the runtime's maximum.
    pub fn grants(
        &self,
        memory_limit_bytes: Option<u64>,
        call_fuel: Option<u64>,
    ) -> Result<Grants, String> {
        let defaults = self.default_grants();
        let max_memory = self
            .options
            .max_memory_limit_bytes
            .max(defaults.memory_limit_bytes);
        let memory_limit_bytes = match memory_limit_bytes {
            None => defaults.memory_limit_bytes,
            Some(bytes) if (1 << 20..=max_memory as u64).contains(&bytes) => bytes as usize,
            Some(bytes) => {
                return Err(format!(
                    "memory_limit_bytes is {bytes}; 1 MiB to {max_memory} (policy_max_memory_limit_bytes) may be granted"
                ));
            }
        };
        let max_fuel = self.options.max_call_fuel.max(defaults.call_fuel);
        let call_fuel = match call_fuel {
            None => defaults.call_fuel,
            Some(fuel) if (1_000..=max_fuel).contains(&fuel) => fuel,
            Some(fuel) => {
                return Err(format!(
                    "call_fuel is {fuel}; 1000 to {max_fuel} (policy_max_call_fuel) may be granted"
                ));
            }
        };
        Ok(Grants {
            memory_limit_bytes,
            call_fuel,
        })
    }

    /// A fresh store for one instance of a version with `grants` and `data`, with no fuel
    /// until armed.
    pub fn store(&self, grants: Grants, data: PolicyData) -> Store<Sandbox> {
        let limits = wasmtime::StoreLimitsBuilder::new()
            .memory_size(grants.memory_limit_bytes)
            .build();
        let mut store = Store::new(
            &self.engine,
            Sandbox {
                limits,
                call_fuel: grants.call_fuel.max(1),
                data,
                wasi: WasiState::default(),
            },
        );
        store.limiter(|sandbox| &mut sandbox.limits);
        store
    }

    /// Readies the store for one call at `now_ms`: the call's fuel (what the last call left is
    /// not carried over), and the virtual clock and random stream for that instant.
    pub fn arm(&self, store: &mut Store<Sandbox>, now_ms: u64) {
        store.data_mut().wasi.enter_call(now_ms);
        let fuel = store.data().call_fuel;
        // Fails only when fuel is not enabled, and it always is on this engine.
        let _ = store.set_fuel(fuel);
    }
}

/// The kind whose policy interface `bytes` exports at its top level, read without compiling
/// it; `None` for a component that exports none (or is not one).
pub fn exported_kind(bytes: &[u8]) -> Option<Kind> {
    use wasmparser::{Parser, Payload};
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.ok()? {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.checked_sub(1)?,
            Payload::ComponentExportSection(exports) if depth == 0 => {
                for export in exports {
                    let name = export.ok()?.name.name;
                    let Some(interface) = name.strip_prefix("sluice:policy/") else {
                        continue;
                    };
                    let interface = interface.split('@').next().unwrap_or(interface);
                    if let Some(kind) = Kind::ALL.into_iter().find(|k| k.as_str() == interface) {
                        return Some(kind);
                    }
                }
            }
            _ => {}
        }
    }
    None
}

impl Compiled {
    fn check_world(&self) -> Result<(), PolicyError> {
        use super::bindings::*;
        let wrong = |_: wasmtime::Error| {
            let component = self.pre.component();
            let exports = component.component_type();
            let engine = component.engine();
            let names = exports.exports(engine).map(|(name, _)| name);
            PolicyError::WrongWorld(self.kind, refusals::wrong_world(self.kind, names))
        };
        let pre = self.pre.clone();
        match self.kind {
            Kind::Priority => priority::PriorityPolicyPre::new(pre)
                .map(drop)
                .map_err(wrong),
            Kind::Aging => aging::AgingPolicyPre::new(pre).map(drop).map_err(wrong),
            Kind::Retry => retry::RetryPolicyPre::new(pre).map(drop).map_err(wrong),
            Kind::Split => split::SplitPolicyPre::new(pre).map(drop).map_err(wrong),
            Kind::Merge => merge::MergePolicyPre::new(pre).map(drop).map_err(wrong),
        }
    }
}
