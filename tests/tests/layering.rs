//! The layering the code promises, checked on the sources: the engine and the driver import no
//! shell, no backend, no wasmtime code, no HTTP and no telemetry; only the sled backend's folder
//! names sled in code; the policy runtime does not reach back into telemetry.

use std::path::{Path, PathBuf};

fn sources(under: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../host/src")
        .join(under);
    let mut found = Vec::new();
    let mut folders = vec![root];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    assert!(!found.is_empty(), "no sources under {under}");
    found
}

/// The lines of `path` that are code, not comments.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    std::fs::read_to_string(path)
        .expect("a readable source")
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(n, line)| (n + 1, line.to_owned()))
        .collect()
}

fn offenders(under: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for path in sources(under) {
        for (n, line) in code_lines(&path) {
            if let Some(word) = forbidden.iter().find(|word| line.contains(*word)) {
                found.push(format!("{}:{n}: {word}", path.display()));
            }
        }
    }
    found
}

#[test]
fn the_engine_and_the_driver_depend_on_no_shell_backend_runtime_or_http() {
    let forbidden = [
        "crate::scheduler",
        "crate::api",
        "crate::telemetry",
        "crate::policy",
        "store::sled",
        "SledStore",
        "wasmtime",
        "axum",
    ];
    let mut found = offenders("engine", &forbidden);
    found.extend(offenders("sim", &forbidden));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_replay_runs_policies_on_the_driver_without_the_servers_shell() {
    // It loads the real components through the policy registry, but schedules through the
    // driver: no writer thread, no HTTP, no telemetry.
    let forbidden = ["crate::scheduler", "crate::api", "crate::telemetry", "axum"];
    let found = offenders("replay", &forbidden);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn only_the_sled_backend_names_sled_in_code() {
    let backend = Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src/store/sled");
    let mut found = Vec::new();
    for path in sources("") {
        if path.starts_with(&backend) || path.ends_with("store/mod.rs") {
            continue;
        }
        for (n, line) in code_lines(&path) {
            if line.contains("sled") && !line.contains("///") {
                found.push(format!("{}:{n}", path.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "sled named outside its backend:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_policy_runtime_does_not_import_telemetry() {
    let found = offenders("policy", &["crate::telemetry"]);
    assert!(found.is_empty(), "{}", found.join("\n"));
}
