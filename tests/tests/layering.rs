//! The layering the workspace promises. Which crate may use which is Cargo's to enforce: a
//! crate cannot name what it does not depend on. What is checked here is the rest: that no
//! one adds a dependency that breaks a layer (read from `cargo tree`, with each crate's own
//! features, as a build of that crate alone would resolve them), and that the engine stays
//! deterministic, which no dependency list can say.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The packages a normal (not dev, not build) build of `package` compiles, by name.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .current_dir(workspace())
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["-p", package])
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Each crate, with the packages its build must not compile.
const FORBIDDEN: &[(&str, &[&str])] = &[
    (
        "sluice-model",
        &[
            "tokio", "sled", "sqlx", "wasmtime", "axum", "utoipa", "reqwest",
        ],
    ),
    (
        "sluice-store",
        &[
            "tokio",
            "sled",
            "sqlx",
            "wasmtime",
            "axum",
            "utoipa",
            "sluice-engine",
        ],
    ),
    (
        "sluice-engine",
        &[
            "tokio",
            "sled",
            "sqlx",
            "wasmtime",
            "axum",
            "utoipa",
            "reqwest",
            "sluice-store-sled",
            "sluice-store-postgres",
            "sluice-policy-runtime",
        ],
    ),
    (
        "sluice-policy-runtime",
        &[
            "tokio",
            "sled",
            "sqlx",
            "axum",
            "utoipa",
            "reqwest",
            "sluice-store-sled",
        ],
    ),
    (
        "sluice-store-sled",
        &[
            "tokio",
            "sqlx",
            "wasmtime",
            "axum",
            "utoipa",
            "sluice-engine",
        ],
    ),
    (
        "sluice-store-postgres",
        &["sled", "wasmtime", "axum", "utoipa", "sluice-engine"],
    ),
    (
        "sluice-stats",
        &["tokio", "sled", "sqlx", "wasmtime", "axum"],
    ),
    (
        "sluice-wire",
        &["tokio", "sled", "sqlx", "wasmtime", "axum", "utoipa"],
    ),
    // What a GPU service compiles when it embeds the worker.
    (
        "sluice-client",
        &[
            "sled",
            "sqlx",
            "wasmtime",
            "axum",
            "utoipa",
            "sluice-engine",
            "sluice-store",
            "sluice-policy-runtime",
            "sluice-server",
        ],
    ),
];

#[test]
fn no_crate_compiles_what_its_layer_forbids() {
    let mut found = Vec::new();
    for (package, forbidden) in FORBIDDEN {
        let dependencies = normal_dependencies(package);
        assert!(
            dependencies.contains(*package),
            "cargo tree -p {package} does not list the package itself"
        );
        for name in *forbidden {
            if dependencies.contains(*name) {
                found.push(format!("{package} compiles {name}"));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_server_is_the_only_crate_below_the_command_that_compiles_axum() {
    // The check above, turned around: it would pass vacuously if axum were gone altogether.
    assert!(normal_dependencies("sluice-server").contains("axum"));
    assert!(normal_dependencies("sluice-policy-runtime").contains("wasmtime"));
}

/// The engine's sources, tests aside: its determinism is a property of its code.
fn engine_sources() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![workspace().join("host/engine/src")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a source folder") {
            let path = entry.expect("an entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                folders.push(path);
            } else if name.ends_with(".rs") && !name.ends_with("tests.rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    assert!(
        found.len() > 10,
        "the engine's sources are not where expected"
    );
    found
}

#[test]
fn the_engine_reads_no_clock_spawns_nothing_and_draws_no_entropy() {
    // Time and random bits are arguments of a step, so any run replays from its inputs.
    let forbidden = [
        "Instant::now",
        "SystemTime",
        "thread::spawn",
        "thread::sleep",
        "thread_rng",
        "rand::rng()",
        "from_os_rng",
        "OsRng",
        "std::fs",
        "std::net",
    ];
    let mut found = Vec::new();
    for path in engine_sources() {
        let text = std::fs::read_to_string(&path).expect("a readable source");
        // Test modules at the end of a file may do as they like.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if let Some(word) = forbidden.iter().find(|w| line.contains(*w)) {
                found.push(format!("{}:{}: {word}", path.display(), n + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}
