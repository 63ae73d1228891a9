//! The policy kit end to end: `sluice policy new retry` writes a project on the Rust SDK; a
//! retry policy of about 20 lines written into it builds for wasm32-wasip2, passes `sluice
//! policy check`, benches, uploads through the CLI and decides live on a real server.

use sluice_tests::*;
use std::process::Output;

/// Retries a failure after exactly `delay_ms` (the built-in policy draws a jittered backoff
/// of up to 5 minutes), except those that must be dead.
const MY_RETRY: &str = r#"
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;

use alloc::string::String;
use sluice_policy::{Config, DeadReason, Decision, ErrorClass, Failure, Retry};

pub struct Stubborn {
    delay_ms: u64,
}

impl Retry for Stubborn {
    fn init(config: &Config) -> Result<Self, String> {
        Ok(Stubborn { delay_ms: config.u64_or("delay_ms", 4242)? })
    }

    fn decide(&self, _now_ms: u64, failure: &Failure) -> Decision {
        match failure.class {
            ErrorClass::Permanent => Decision::Dead(DeadReason::Permanent),
            ErrorClass::InvalidInput => Decision::Dead(DeadReason::InvalidInput),
            _ if failure.task.attempt >= failure.max_attempts => {
                Decision::Dead(DeadReason::AttemptsSpent)
            }
            _ => Decision::RetryAfterMs(self.delay_ms),
        }
    }
}

sluice_policy::retry_policy!(Stubborn, settings = ["delay_ms"]);
"#;

fn sluice(args: &[&str]) -> Output {
    run_sluice(args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_from_the_template_builds_checks_uploads_and_decides_live() {
    let dir = tempfile::tempdir().unwrap();
    let created = succeeded(sluice(&[
        "policy",
        "new",
        "retry",
        "my-retry",
        "--dir",
        dir.path().to_str().unwrap(),
    ]));
    let project = dir.path().join("my-retry");
    assert_eq!(created.trim(), project.display().to_string());
    // The template builds as written, and so does a policy of our own in its place.
    let template = build_policy_project(&project, "my-retry");
    assert!(template.starts_with(b"\0asm"));
    std::fs::write(project.join("src/lib.rs"), MY_RETRY).unwrap();
    let component = build_policy_project(&project, "my-retry");
    let file = dir.path().join("my_retry.wasm");
    std::fs::write(&file, &component).unwrap();

    let checked = succeeded(sluice(&["policy", "check", file.to_str().unwrap()]));
    assert!(checked.contains("is a retry policy"), "{checked}");
    let refused = sluice(&["policy", "check", "--kind", "merge", file.to_str().unwrap()]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("world"));
    let benched = succeeded(sluice(&[
        "policy",
        "bench",
        file.to_str().unwrap(),
        "--decisions",
        "2000",
    ]));
    assert!(
        benched.contains("ns/decision") && benched.contains("1000"),
        "{benched}"
    );

    let server = Server::start(&dir.path().join("data"));
    let uploaded = succeeded(sluice(&[
        "policy",
        "upload",
        "--server",
        &server.url,
        "retry",
        file.to_str().unwrap(),
    ]));
    let version: Value = serde_json::from_str(&uploaded).unwrap();
    let version = version["version"].as_u64().unwrap().to_string();
    succeeded(sluice(&[
        "policy",
        "activate",
        "--server",
        &server.url,
        "retry",
        &version,
    ]));

    // A transient failure waits exactly 4,242 ms under this policy.
    let client = http();
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan", "max_attempts": 3}),
    )
    .await;
    let id = submitted.body["id"].as_str().unwrap().to_owned();
    register_worker(&client, &server, "gpu-1", 1).await;
    let lease = claim_lease(&client, &server, "gpu-1").await;
    let token = lease["lease_token"].as_str().unwrap();
    let failed = report(
        &client,
        &server,
        &id,
        "fail",
        json!({"lease_token": token, "class": "transient", "message": "busy"}),
    )
    .await;
    assert_eq!(failed.status, 200, "{:?}", failed.body);
    assert_eq!(failed.body["state"], "retry_wait", "{:?}", failed.body);
    let delay = failed.body["not_before_ms"].as_u64().unwrap()
        - failed.body["updated_at_ms"].as_u64().unwrap();
    assert_eq!(
        delay, 4242,
        "the uploaded policy did not decide: {:?}",
        failed.body
    );
}
