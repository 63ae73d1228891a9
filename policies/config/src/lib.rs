//! What every default policy shares: its init config, UTF-8 `name=value` lines (blank lines and
//! `#` comments allowed), where each policy names the settings it knows and any other name is an
//! error, so a typo fails `init` instead of silently running with a default; the slot that
//! keeps the parsed settings between calls; the bound on a split's children; and, in the
//! wasm32 build, the allocator and panic handler of the no_std guests.

#![no_std]

extern crate alloc;
#[cfg(test)]
extern crate std;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

// memcpy, memcmp and friends come from wasi-libc, as they do for a std guest; only these pure
// functions are linked, so the component still imports nothing.
#[cfg(target_arch = "wasm32")]
#[link(name = "c")]
unsafe extern "C" {}

/// The allocation entry point the component model calls to pass lists and strings in. A std
/// guest gets it from wasi-libc (over malloc); a no_std one exports it over the Rust allocator.
///
/// # Safety
/// Called only by the host's canonical ABI code, with the arguments that ABI defines.
#[cfg(target_arch = "wasm32")]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(
    old_ptr: *mut u8,
    old_len: usize,
    align: usize,
    new_len: usize,
) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    // SAFETY: the canonical ABI passes a power-of-two `align` and the size and alignment the
    // block at `old_ptr` was allocated with, which is what `Layout` and `realloc` require.
    let moved = unsafe {
        if old_len == 0 {
            if new_len == 0 {
                return align as *mut u8;
            }
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(
                old_ptr,
                Layout::from_size_align_unchecked(old_len, align),
                new_len,
            )
        }
    };
    if moved.is_null() {
        // Out of memory: a trap, which the host counts as a fault.
        core::arch::wasm32::unreachable()
    }
    moved
}

/// The guests' heap: std's own wasm32 allocator.
#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// A panic in a guest ends the call with a trap, which the host counts as a fault; there is
/// nowhere to print a message.
#[cfg(all(target_arch = "wasm32", not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::arch::wasm32::unreachable()
}

/// A policy's settings: stored by `init`, read by every call. Each component instance has its
/// own memory, so a `static` slot belongs to one instance.
pub struct Slot<T> {
    value: spin::Mutex<Option<T>>,
}

impl<T: Clone + Default> Slot<T> {
    pub const fn new() -> Self {
        Slot {
            value: spin::Mutex::new(None),
        }
    }

    pub fn set(&self, value: T) {
        *self.value.lock() = Some(value);
    }

    /// The settings `init` stored, or the defaults before any `init`.
    pub fn get(&self) -> T {
        self.value.lock().clone().unwrap_or_default()
    }
}

impl<T: Clone + Default> Default for Slot<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Refuses a split into more children than `max_children`: a split too fine costs more to
/// schedule than to run (seed 000).
pub fn check_children(children: u32, max_children: u32, what: &str) -> Result<(), String> {
    if children > max_children {
        return Err(format!(
            "{children} {what} would make more children than the limit of {max_children}"
        ));
    }
    Ok(())
}

/// Why a config was refused. It converts into the `String` an `init` answers with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// The bytes are not UTF-8.
    NotUtf8,
    /// Line `line` (from 1) is not `name=value`.
    Syntax { line: usize },
    /// A name the policy does not know, with the names it does.
    Unknown { name: String, known: String },
    /// A value that does not parse as what the setting takes.
    BadValue {
        name: String,
        value: String,
        expected: &'static str,
    },
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ConfigError::NotUtf8 => f.write_str("config is not UTF-8"),
            ConfigError::Syntax { line } => write!(f, "line {line}: expected name=value"),
            ConfigError::Unknown { name, known } => {
                write!(f, "unknown setting `{name}`; known: {known}")
            }
            ConfigError::BadValue {
                name,
                value,
                expected,
            } => write!(f, "`{name}`: bad value `{value}` (expected {expected})"),
        }
    }
}

impl From<ConfigError> for String {
    fn from(error: ConfigError) -> String {
        error.to_string()
    }
}

pub struct Config {
    values: BTreeMap<String, String>,
}

impl Config {
    /// Parses `bytes`, refusing names outside `known`.
    pub fn parse(bytes: &[u8], known: &[&str]) -> Result<Config, ConfigError> {
        let text = core::str::from_utf8(bytes).map_err(|_| ConfigError::NotUtf8)?;
        let mut values = BTreeMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, value) = line
                .split_once('=')
                .ok_or(ConfigError::Syntax { line: number + 1 })?;
            let name = name.trim();
            if !known.contains(&name) {
                return Err(ConfigError::Unknown {
                    name: name.to_string(),
                    known: known.join(", "),
                });
            }
            values.insert(name.to_string(), value.trim().to_string());
        }
        Ok(Config { values })
    }

    /// Whether the config sets `name`.
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// The text of `name`, if the config sets it.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    pub fn u64_or(&self, name: &str, default: u64) -> Result<u64, ConfigError> {
        self.parsed_or(name, default, "a whole number")
    }

    pub fn u32_or(&self, name: &str, default: u32) -> Result<u32, ConfigError> {
        self.parsed_or(name, default, "a whole number below 2^32")
    }

    pub fn f64_or(&self, name: &str, default: f64) -> Result<f64, ConfigError> {
        let value: f64 = self.parsed_or(name, default, "a finite number")?;
        if value.is_finite() {
            Ok(value)
        } else {
            Err(self.bad(name, "a finite number"))
        }
    }

    fn bad(&self, name: &str, expected: &'static str) -> ConfigError {
        ConfigError::BadValue {
            name: name.to_string(),
            value: self.values.get(name).cloned().unwrap_or_default(),
            expected,
        }
    }

    /// A comma-separated list, e.g. `weights=60,35,5`.
    pub fn list_or<T: core::str::FromStr + Clone>(
        &self,
        name: &str,
        default: &[T],
    ) -> Result<Vec<T>, ConfigError> {
        match self.values.get(name) {
            None => Ok(default.to_vec()),
            Some(text) => text
                .split(',')
                .map(|item| {
                    item.trim().parse().map_err(|_| ConfigError::BadValue {
                        name: name.to_string(),
                        value: item.trim().to_string(),
                        expected: "a comma-separated list of numbers",
                    })
                })
                .collect(),
        }
    }

    fn parsed_or<T: core::str::FromStr>(
        &self,
        name: &str,
        default: T,
        expected: &'static str,
    ) -> Result<T, ConfigError> {
        match self.values.get(name) {
            None => Ok(default),
            Some(text) => text.parse().map_err(|_| self.bad(name, expected)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_gives_defaults_until_set() {
        static SLOT: Slot<u32> = Slot::new();
        assert_eq!(SLOT.get(), 0);
        SLOT.set(7);
        assert_eq!(SLOT.get(), 7);
    }

    #[test]
    fn children_past_the_bound_are_refused() {
        assert!(check_children(256, 256, "shards").is_ok());
        let refused = check_children(257, 256, "shards").unwrap_err();
        assert!(refused.contains("257 shards") && refused.contains("256"));
    }

    #[test]
    fn parses_known_names_and_refuses_the_rest() {
        let config = Config::parse(
            b"# comment\n\ndelay_ms = 100\nweights=1, 2,3\n",
            &["delay_ms", "weights", "x"],
        )
        .unwrap();
        assert_eq!(config.u64_or("delay_ms", 5).unwrap(), 100);
        assert_eq!(config.u64_or("x", 5).unwrap(), 5);
        assert_eq!(config.list_or::<u32>("weights", &[]).unwrap(), [1, 2, 3]);
        assert!(matches!(
            Config::parse(b"delay=1", &["delay_ms"]),
            Err(ConfigError::Unknown { .. })
        ));
        assert!(Config::parse(b"no equals sign", &["delay_ms"]).is_err());
        assert!(Config::parse(&[0xff], &[]).is_err());
        let bad = Config::parse(b"delay_ms=soon", &["delay_ms"]).unwrap();
        assert!(bad.u64_or("delay_ms", 1).is_err());
        let nan = Config::parse(b"f=NaN", &["f"]).unwrap();
        assert!(nan.f64_or("f", 1.0).is_err());
    }
}
