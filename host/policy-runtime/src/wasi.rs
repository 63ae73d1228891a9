//! The virtual WASI a policy component sees: the clock frozen at the call's `now-ms`, random
//! bits from a stream seeded by that instant, an empty environment, no preopened directories,
//! and standard output and error kept as a short tail for fault messages. Interpreted guests
//! (componentize-py, componentize-js) import these at start-up whether or not the policy uses
//! them; giving them fixed answers keeps every decision a pure, replayable function of the
//! call's arguments.
//!
//! What is not virtualised here is linked as a trap by the runtime (calling it ends the call
//! as a fault): sockets, the filesystem's operations (no descriptor can be had without a
//! preopen), polling, stdin, exit. Any interface outside `ALLOWED_IMPORT_PREFIXES` in
//! `runtime.rs` is refused at upload.

use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use wasmtime::component::{ComponentType, Linker, LinkerInstance, Lower, Resource, ResourceType};

/// The most of a guest's standard output and error kept (the end of it).
pub const OUTPUT_TAIL_BYTES: usize = 2048;

/// The most random bytes one `get-random-bytes` call answers; more is a fault, like a read
/// past a bound.
const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// What the virtual WASI of one store holds.
#[derive(Default)]
pub struct WasiState {
    now_ms: u64,
    /// Made on the first random request of a call, from `now_ms`.
    rng: Option<SmallRng>,
    output_tail: Vec<u8>,
}

impl WasiState {
    /// Freezes the clock at `now_ms` for the next call and restarts its random stream.
    pub fn enter_call(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.rng = None;
    }

    /// The end of what the guest wrote to standard output or error, as text.
    pub fn output_tail(&self) -> String {
        String::from_utf8_lossy(&self.output_tail).trim().to_owned()
    }

    fn rng(&mut self) -> &mut SmallRng {
        let now_ms = self.now_ms;
        // The seed is the instant alone, so a replay of the same call draws the same bits.
        self.rng
            .get_or_insert_with(|| SmallRng::seed_from_u64(now_ms ^ 0x5eed_5a1c_e000_0000))
    }

    fn random_bytes(&mut self, len: u64) -> wasmtime::Result<Vec<u8>> {
        if len > MAX_RANDOM_BYTES {
            wasmtime::bail!("asked for {len} random bytes; a call may have {MAX_RANDOM_BYTES}");
        }
        let mut bytes = vec![0; len as usize];
        self.rng().fill_bytes(&mut bytes);
        Ok(bytes)
    }

    fn keep_output(&mut self, bytes: &[u8]) {
        self.output_tail.extend_from_slice(bytes);
        if self.output_tail.len() > OUTPUT_TAIL_BYTES {
            let cut = self.output_tail.len() - OUTPUT_TAIL_BYTES;
            self.output_tail.drain(..cut);
        }
        debug_assert!(self.output_tail.len() <= OUTPUT_TAIL_BYTES);
    }
}

/// Where a store keeps its `WasiState`.
pub trait HasWasi: 'static {
    fn wasi(&mut self) -> &mut WasiState;
}

/// The host side of `wasi:io/streams#output-stream`: standard output or error.
struct OutputSink;
/// The host side of `wasi:io/error#error`; never made, since writes never fail.
struct IoError;
/// The host side of `wasi:filesystem/types#descriptor`; never made, since nothing is opened.
struct Descriptor;
/// The host side of `wasi:cli/terminal-*`; never made, since no stream is a terminal.
struct Terminal;
/// The host side of `wasi:io/poll#pollable`: always ready, since nothing here waits (a sleep
/// on the frozen clock returns at once).
struct Pollable;

#[derive(ComponentType, Lower)]
#[component(record)]
struct Datetime {
    seconds: u64,
    nanoseconds: u32,
}

#[derive(ComponentType, Lower)]
#[component(variant)]
#[allow(dead_code)] // the host never fails a write, but the type must name both cases
enum StreamError {
    #[component(name = "last-operation-failed")]
    LastOperationFailed(Resource<IoError>),
    #[component(name = "closed")]
    Closed,
}

/// How much a write may be: larger writes are accepted and only their end kept.
const WRITE_BUDGET_BYTES: u64 = 1 << 16;

/// Whether `import` (a full name with its version) is one this module answers.
pub fn virtualises(import: &str) -> bool {
    let interface = import.split('@').next().unwrap_or(import);
    matches!(
        interface,
        "wasi:clocks/monotonic-clock"
            | "wasi:clocks/wall-clock"
            | "wasi:random/random"
            | "wasi:random/insecure"
            | "wasi:random/insecure-seed"
            | "wasi:cli/environment"
            | "wasi:cli/stdout"
            | "wasi:cli/stderr"
            | "wasi:cli/terminal-stdin"
            | "wasi:cli/terminal-stdout"
            | "wasi:cli/terminal-stderr"
            | "wasi:io/streams"
            | "wasi:io/poll"
            | "wasi:filesystem/preopens"
    )
}

/// Defines the virtual WASI for `component`'s imports, exactly as it names them; the caller
/// links whatever is left as traps.
pub fn define_for<T: HasWasi>(
    linker: &mut Linker<T>,
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> wasmtime::Result<()> {
    use wasmtime::component::types::ComponentItem;
    for (import, item) in component.component_type().imports(engine) {
        let ComponentItem::ComponentInstance(interface) = item.ty else {
            continue;
        };
        // A resource is named again in every interface that `use`s it, and each name must be
        // bound to the same host type as the interface that defines it.
        let mut instance = linker.instance(import)?;
        for (name, export) in interface.exports(engine) {
            if !matches!(export.ty, ComponentItem::Resource(_)) {
                continue;
            }
            match name {
                "output-stream" => {
                    instance.resource(name, ResourceType::host::<OutputSink>(), |_, _| Ok(()))?
                }
                "error" => {
                    instance.resource(name, ResourceType::host::<IoError>(), |_, _| Ok(()))?
                }
                "descriptor" => {
                    instance.resource(name, ResourceType::host::<Descriptor>(), |_, _| Ok(()))?
                }
                "pollable" => {
                    instance.resource(name, ResourceType::host::<Pollable>(), |_, _| Ok(()))?
                }
                "terminal-input" | "terminal-output" => {
                    instance.resource(name, ResourceType::host::<Terminal>(), |_, _| Ok(()))?
                }
                _ => {}
            }
        }
        if virtualises(import) {
            define(linker, import)?;
        }
    }
    Ok(())
}

/// Defines the virtual functions of `import`.
fn define<T: HasWasi>(linker: &mut Linker<T>, import: &str) -> wasmtime::Result<()> {
    let interface = import.split('@').next().unwrap_or(import);
    let mut instance = linker.instance(import)?;
    match interface {
        "wasi:clocks/monotonic-clock" => {
            instance.func_wrap("now", |mut store, (): ()| {
                Ok((store.data_mut().wasi().now_ms.saturating_mul(1_000_000),))
            })?;
            instance.func_wrap("resolution", |_, (): ()| Ok((1_000_000u64,)))?;
            for subscribe in ["subscribe-instant", "subscribe-duration"] {
                instance.func_wrap(subscribe, |_, (_when,): (u64,)| Ok((ready(),)))?;
            }
        }
        "wasi:clocks/wall-clock" => {
            instance.func_wrap("now", |mut store, (): ()| {
                let now_ms = store.data_mut().wasi().now_ms;
                let datetime = Datetime {
                    seconds: now_ms / 1000,
                    nanoseconds: (now_ms % 1000) as u32 * 1_000_000,
                };
                Ok((datetime,))
            })?;
            instance.func_wrap("resolution", |_, (): ()| {
                Ok((Datetime {
                    seconds: 0,
                    nanoseconds: 1_000_000,
                },))
            })?;
        }
        // Secure and insecure random bits are the same seeded stream: replay matters here,
        // secrecy does not (a policy holds no secrets).
        "wasi:random/random" | "wasi:random/insecure" => {
            let infix = if interface.ends_with("insecure") {
                "insecure-"
            } else {
                ""
            };
            let bytes = format!("get-{infix}random-bytes");
            instance.func_wrap(&bytes, |mut store, (len,): (u64,)| {
                Ok((store.data_mut().wasi().random_bytes(len)?,))
            })?;
            let word = format!("get-{infix}random-u64");
            instance.func_wrap(&word, |mut store, (): ()| {
                Ok((store.data_mut().wasi().rng().next_u64(),))
            })?;
        }
        "wasi:random/insecure-seed" => {
            instance.func_wrap("insecure-seed", |mut store, (): ()| {
                let rng = store.data_mut().wasi().rng();
                Ok(((rng.next_u64(), rng.next_u64()),))
            })?;
        }
        "wasi:cli/environment" => {
            instance.func_wrap("get-environment", |_, (): ()| {
                Ok((Vec::<(String, String)>::new(),))
            })?;
            instance.func_wrap("get-arguments", |_, (): ()| Ok((Vec::<String>::new(),)))?;
            instance.func_wrap("initial-cwd", |_, (): ()| Ok((None::<String>,)))?;
        }
        "wasi:cli/stdout" => {
            instance.func_wrap("get-stdout", |_, (): ()| {
                Ok((Resource::<OutputSink>::new_own(1),))
            })?;
        }
        "wasi:cli/stderr" => {
            instance.func_wrap("get-stderr", |_, (): ()| {
                Ok((Resource::<OutputSink>::new_own(2),))
            })?;
        }
        // `wasi:cli/terminal-stdin` has `get-terminal-stdin`, and so on: no stream is one.
        "wasi:cli/terminal-stdin" | "wasi:cli/terminal-stdout" | "wasi:cli/terminal-stderr" => {
            let getter = format!("get-{}", interface.trim_start_matches("wasi:cli/"));
            instance.func_wrap(&getter, |_, (): ()| Ok((None::<Resource<Terminal>>,)))?;
        }
        "wasi:io/streams" => define_output_stream(&mut instance)?,
        "wasi:io/poll" => {
            instance.func_wrap(
                "[method]pollable.ready",
                |_, (_p,): (Resource<Pollable>,)| Ok((true,)),
            )?;
            instance.func_wrap(
                "[method]pollable.block",
                |_, (_p,): (Resource<Pollable>,)| Ok(()),
            )?;
            instance.func_wrap("poll", |_, (waited,): (Vec<Resource<Pollable>>,)| {
                Ok(((0..waited.len() as u32).collect::<Vec<u32>>(),))
            })?;
        }
        "wasi:filesystem/preopens" => {
            instance.func_wrap("get-directories", |_, (): ()| {
                Ok((Vec::<(Resource<Descriptor>, String)>::new(),))
            })?;
        }
        _ => {}
    }
    Ok(())
}

fn ready() -> Resource<Pollable> {
    Resource::new_own(0)
}

/// Output streams accept every write at once and keep its end; `subscribe` and the other
/// methods stay traps.
fn define_output_stream<T: HasWasi>(instance: &mut LinkerInstance<'_, T>) -> wasmtime::Result<()> {
    type Answer = Result<(), StreamError>;
    instance.func_wrap(
        "[method]output-stream.check-write",
        |_, (_sink,): (Resource<OutputSink>,)| Ok((Ok::<u64, StreamError>(WRITE_BUDGET_BYTES),)),
    )?;
    for write in [
        "[method]output-stream.write",
        "[method]output-stream.blocking-write-and-flush",
    ] {
        instance.func_wrap(
            write,
            |mut store, (_sink, bytes): (Resource<OutputSink>, Vec<u8>)| {
                store.data_mut().wasi().keep_output(&bytes);
                Ok((Answer::Ok(()),))
            },
        )?;
    }
    instance.func_wrap(
        "[method]output-stream.subscribe",
        |_, (_sink,): (Resource<OutputSink>,)| Ok((ready(),)),
    )?;
    for flush in [
        "[method]output-stream.flush",
        "[method]output-stream.blocking-flush",
    ] {
        instance.func_wrap(flush, |_, (_sink,): (Resource<OutputSink>,)| {
            Ok((Answer::Ok(()),))
        })?;
    }
    Ok(())
}
