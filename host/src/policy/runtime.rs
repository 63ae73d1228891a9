//! Compiling, checking and instantiating policy components: one engine, an epoch ticker for
//! call deadlines, the pooling allocator with a memory cap per instance, and an import allowlist.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use wasmtime::component::{Component, InstancePre, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};

/// The policy kinds, one WIT world each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Priority,
    Aging,
    Retry,
    Split,
    Merge,
}

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("not a valid component: {0}")]
    Compile(String),
    #[error("imports {}, which policies are not granted", .0.join(", "))]
    ForbiddenImport(Vec<String>),
    #[error("does not export the {0:?} world: {1}")]
    WrongWorld(Kind, String),
    #[error("init refused its config: {0}")]
    Init(String),
    #[error("faulted: {0}")]
    Fault(String),
    #[error("policy runtime failure: {0}")]
    Runtime(String),
}

#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    pub memory_limit_bytes: usize,
    pub call_deadline_ms: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            memory_limit_bytes: 16 << 20,
            call_deadline_ms: 10,
        }
    }
}

/// What a policy instance's `Store` holds. Policies are granted nothing, so it is empty.
#[derive(Default)]
pub struct Sandbox;

/// What a policy may import: the policy package's own types, and the interfaces a std guest
/// imports only for its abort path, linked as traps (calling one ends the call). Nothing that
/// gives files, sockets, clocks or randomness is here.
const ALLOWED_IMPORT_PREFIXES: [&str; 10] = [
    "sluice:policy/types@",
    "wasi:io/poll@",
    "wasi:cli/environment@",
    "wasi:cli/exit@",
    "wasi:cli/stdin@",
    "wasi:cli/stdout@",
    "wasi:cli/stderr@",
    "wasi:cli/terminal-",
    "wasi:io/error@",
    "wasi:io/streams@",
];

/// Epochs tick every millisecond; a call's deadline is counted in them.
const EPOCH_TICK: Duration = Duration::from_millis(1);

pub struct PolicyRuntime {
    engine: Engine,
    options: RuntimeOptions,
    ticking: Arc<AtomicBool>,
}

/// A compiled component of one kind, ready to instantiate cheaply.
pub struct Compiled {
    pub kind: Kind,
    pub pre: InstancePre<Sandbox>,
}

impl PolicyRuntime {
    pub fn new(options: RuntimeOptions) -> Result<PolicyRuntime, PolicyError> {
        let runtime = |e: wasmtime::Error| PolicyError::Runtime(e.to_string());
        let mut pooling = PoolingAllocationConfig::default();
        pooling.max_memory_size(options.memory_limit_bytes);
        pooling.total_component_instances(256);
        pooling.total_core_instances(1024);
        pooling.total_memories(512);
        pooling.total_tables(512);
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = Engine::new(&config).map_err(runtime)?;
        let ticking = Arc::new(AtomicBool::new(true));
        let (ticker_engine, still_ticking) = (engine.clone(), ticking.clone());
        std::thread::Builder::new()
            .name("sluice-epoch".into())
            .spawn(move || {
                while still_ticking.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })
            .map_err(|e| PolicyError::Runtime(e.to_string()))?;
        Ok(PolicyRuntime {
            engine,
            options,
            ticking,
        })
    }

    pub fn options(&self) -> &RuntimeOptions {
        &self.options
    }

    /// Compiles `bytes` as a component of `kind`: it must be a component, import only what
    /// the allowlist grants, and export its kind's world.
    pub fn compile(&self, kind: Kind, bytes: &[u8]) -> Result<Compiled, PolicyError> {
        let component = Component::new(&self.engine, bytes)
            .map_err(|e| PolicyError::Compile(format!("{e:#}")))?;
        let forbidden: Vec<String> = component
            .component_type()
            .imports(&self.engine)
            .map(|(name, _)| name)
            .inspect(|name| tracing::debug!(import = name, ?kind, "checking a policy import"))
            .filter(|name| !ALLOWED_IMPORT_PREFIXES.iter().any(|p| name.starts_with(p)))
            .map(str::to_owned)
            .collect();
        if !forbidden.is_empty() {
            return Err(PolicyError::ForbiddenImport(forbidden));
        }
        let mut linker = Linker::new(&self.engine);
        linker
            .define_unknown_imports_as_traps(&component)
            .map_err(|e| PolicyError::Runtime(e.to_string()))?;
        let pre = linker
            .instantiate_pre(&component)
            .map_err(|e| PolicyError::Runtime(e.to_string()))?;
        let compiled = Compiled { kind, pre };
        compiled.check_world()?;
        Ok(compiled)
    }

    /// A fresh store for one instance, its call deadline not yet armed.
    pub fn store(&self) -> Store<Sandbox> {
        let mut store = Store::new(&self.engine, Sandbox);
        store.epoch_deadline_trap();
        store
    }

    /// Arms the deadline for the next call: it is relative to now.
    pub fn arm(&self, store: &mut Store<Sandbox>) {
        let ticks = self.options.call_deadline_ms.max(1) / EPOCH_TICK.as_millis().max(1) as u64;
        store.set_epoch_deadline(ticks.max(1));
    }
}

impl Drop for PolicyRuntime {
    fn drop(&mut self) {
        self.ticking.store(false, Ordering::Relaxed);
    }
}

impl Compiled {
    fn check_world(&self) -> Result<(), PolicyError> {
        use super::bindings::*;
        let wrong = |e: wasmtime::Error| PolicyError::WrongWorld(self.kind, format!("{e:#}"));
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
