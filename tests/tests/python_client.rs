//! The Python client's own test suite (`clients/python/tests`, pytest) against this build's
//! `sluice` binary: its servers on port 0 in temporary folders, its workers as processes.
//!
//! It needs a Python with the package and its test extras installed: `SLUICE_PYTHON` (`.ci/run`
//! makes a virtual environment and sets it), or `python3` when that one has them. Without one
//! the test says SKIPPED and passes, unless `SLUICE_REQUIRE_PYTHON_CLIENT=1` (set by `.ci/run`)
//! makes that a failure.

use sluice_tests::sluice_binary;
use std::path::Path;
use std::process::{Command, Stdio};

fn python() -> Option<String> {
    let program = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
    let ready = Command::new(&program)
        .args(["-c", "import sluice_client, pytest, numpy"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    let required = std::env::var("SLUICE_REQUIRE_PYTHON_CLIENT").is_ok_and(|v| v == "1");
    assert!(
        ready || !required,
        "SLUICE_REQUIRE_PYTHON_CLIENT=1 but {program} cannot import sluice_client, pytest and numpy: pip install './clients/python[test]'"
    );
    ready.then_some(program)
}

#[test]
fn the_python_clients_suite_passes_against_this_build() {
    let Some(python) = python() else {
        eprintln!("SKIPPED: no Python with sluice_client (pip install './clients/python[test]')");
        return;
    };
    let package = Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python");
    let output = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&package)
        .env("SLUICE_BIN", sluice_binary())
        .output()
        .expect("run pytest");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the Python client's tests failed");
    // pytest's last line, e.g. "14 passed in 30.1s": every test ran, none was skipped.
    let summary = stdout.lines().last().unwrap_or_default();
    assert!(
        summary.contains(" passed") && !summary.contains("skipped"),
        "{summary}"
    );
}
