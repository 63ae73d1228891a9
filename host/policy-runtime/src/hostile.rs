//! Components for the host's tests only, built on demand (never embedded in the binary):
//! misbehaving ones from `policies/hostile` with one feature each, `policies/legacy-split`,
//! a split component of 0.1.0's world alone, and `policies/by-name`, rules on names.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Builds the `hostile` policy with `feature` and returns the component's bytes.
pub fn component(feature: &str) -> Vec<u8> {
    build("hostile", Some(feature))
}

/// Builds `policies/legacy-split`: a split component that exports 0.1.0's `split` alone.
pub fn legacy_split() -> Vec<u8> {
    build("legacy-split", None)
}

/// Builds `policies/by-name` for `kind` (`priority`, `aging` or `retry`).
pub fn by_name(kind: &str) -> Vec<u8> {
    build("by-name", Some(kind))
}

fn build(package: &str, feature: Option<&str>) -> Vec<u8> {
    // The build script's target directory already holds the guests' dependencies, so only the
    // hostile crate compiles. Builds share it, so they take turns, and each result is read
    // before the next build overwrites it.
    static BUILDING: Mutex<()> = Mutex::new(());
    let _guard = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies/Cargo.toml");
    let target_dir = PathBuf::from(env!("OUT_DIR")).join("policies-target");
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "-p",
            package,
        ])
        .args(feature.map(|f| ["--features", f]).into_iter().flatten())
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("run cargo to build a hostile policy");
    assert!(status.success(), "building {package} {feature:?} failed");
    let file = format!("wasm32-wasip2/release/{}.wasm", package.replace('-', "_"));
    std::fs::read(target_dir.join(file)).expect("the test component")
}
