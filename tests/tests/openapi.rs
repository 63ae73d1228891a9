//! The OpenAPI 3.1 document at `/v1/openapi.json`: every operation it lists is served (the
//! router is mounted from the same annotations, so nothing is served undocumented), and
//! schemathesis, fuzzing a real server with an admin token, finds no server error and no
//! answer that breaks the document's schemas.
//!
//! schemathesis comes from PyPI (`.ci/run` installs it). Without it the fuzzing test says so
//! and passes, unless `SLUICE_REQUIRE_SCHEMATHESIS=1` (set by `.ci/run`) makes it fail.

use sluice_tests::*;
use std::process::{Command, Stdio};

const ROOT: &str = "root-token-for-the-openapi-test";

fn start(dir: &std::path::Path) -> Server {
    // Claims wait at most half a second, so fuzzed long polls stay short.
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        "max_claim_wait_ms = 500\nrequest_timeout_ms = 10000\n",
    )
    .unwrap();
    Server::launch(
        &dir.join("data"),
        &["--config", config.to_str().unwrap()],
        &[("SLUICE_ADMIN_TOKEN", ROOT)],
        Some(&dir.join("server.log")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_served_and_the_document_is_public() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let document = get_json(&http(), &server.endpoint("/v1/openapi.json")).await;
    assert_eq!(document.status, 200);
    let doc = document.body;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    assert!(doc["components"]["schemas"]["Problem"].is_object());
    let admin = http_as(ROOT);
    let mut operations = 0;
    let mut ids = std::collections::HashSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{id}", "01ARZ3NDEKTSV4RRFFQ69G5FAV")
            .replace("{kind}", "retry");
        for (method, operation) in item.as_object().unwrap() {
            operations += 1;
            assert!(ids.insert(operation["operationId"].as_str().unwrap().to_owned()));
            assert!(
                operation["responses"]["default"].is_object(),
                "{method} {path}"
            );
            let method: reqwest::Method = method.to_uppercase().parse().unwrap();
            let answer = answer(
                admin
                    .request(method.clone(), server.endpoint(&concrete))
                    .header("content-type", "application/json")
                    .body("{}")
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            let kind = answer.body["type"].as_str().unwrap_or("");
            assert!(
                !kind.ends_with("route-not-found") && !kind.ends_with("method-not-allowed"),
                "{method} {path} is documented but not served: {:?}",
                answer.body
            );
        }
    }
    assert!(operations >= 31, "only {operations} operations documented");
}

/// The schemathesis command: `SLUICE_SCHEMATHESIS` (`.ci/run` sets it to where pip put it),
/// or from PATH.
fn schemathesis() -> Command {
    Command::new(std::env::var("SLUICE_SCHEMATHESIS").unwrap_or_else(|_| "schemathesis".into()))
}

#[test]
fn schemathesis_finds_no_server_error_and_no_schema_violation() {
    let found = schemathesis()
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        let required = std::env::var("SLUICE_REQUIRE_SCHEMATHESIS").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "SLUICE_REQUIRE_SCHEMATHESIS=1 but schemathesis is not on PATH: pip install schemathesis"
        );
        eprintln!("SKIPPED: no schemathesis (pip install schemathesis)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    let reports = dir.path().join("reports");
    // One worker: schemathesis's generator is not safe across threads (hypothesis's lambda
    // cache breaks). A fixed seed replays a failure.
    let run = schemathesis()
        .args(["run", &server.endpoint("/v1/openapi.json")])
        .args(["-H", &format!("Authorization: Bearer {ROOT}")])
        .args(["--checks", "not_a_server_error,response_schema_conformance"])
        .args(["--max-examples", "20", "--workers", "1", "--seed", "1"])
        // No example database: every run starts from the seed alone, and nothing is written
        // into the working tree.
        .args(["--generation-database", "none"])
        .args(["--report", "junit", "--report-dir"])
        .arg(&reports)
        .env("NO_COLOR", "1")
        .current_dir(dir.path())
        .output()
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let junit = std::fs::read_dir(&reports)
        .ok()
        .and_then(|mut entries| entries.next())
        .and_then(|entry| std::fs::read_to_string(entry.ok()?.path()).ok())
        .unwrap_or_default();
    let count = |needle: &str| junit.matches(needle).count();
    let server_errors = count("Server error");
    let schema_violations = count("Response violates schema");
    let tool_errors = count("<error");
    let generated = stdout
        .lines()
        .find(|line| {
            let line = line.trim();
            line.starts_with(|c: char| c.is_ascii_digit()) && line.contains(" generated")
        })
        .map(str::trim)
        .unwrap_or("?");
    println!(
        "schemathesis: {generated}; {server_errors} server errors, {schema_violations} schema violations, {tool_errors} errors of its own"
    );
    assert!(!junit.is_empty(), "schemathesis wrote no report:\n{stdout}");
    assert_eq!(server_errors, 0, "{stdout}");
    assert_eq!(schema_violations, 0, "{stdout}");
    assert_eq!(tool_errors, 0, "{stdout}");
    assert!(run.status.success(), "{stdout}");
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
    assert!(!log.contains("panicked"), "{log}");
}
