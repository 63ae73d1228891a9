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

/// Memory and fuel are granted per version at upload: a component that holds 24 MiB from
/// `init` is refused under the default 16 MiB and accepted with a larger grant, which the
/// version keeps across a restart; grants past the server's maximum are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_fuel_are_granted_per_version() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big_init.wasm");
    std::fs::write(&file, policy_component("hostile", Some("big-init"))).unwrap();
    let path = file.to_str().unwrap();
    let refused = sluice(&["policy", "check", path]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("init"));
    succeeded(sluice(&[
        "policy",
        "check",
        path,
        "--memory-limit",
        "67108864",
    ]));

    let data = dir.path().join("data");
    let server = Server::start(&data);
    let client = http();
    let bytes = std::fs::read(&file).unwrap();
    let put = |query: &'static str| {
        let (client, url, bytes) = (
            client.clone(),
            server.endpoint(&format!("/v1/policies/retry{query}")),
            bytes.clone(),
        );
        async move {
            answer(
                client
                    .put(url)
                    .header("content-type", "application/wasm")
                    .body(bytes)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    let default = put("").await;
    assert_problem(&default, 422, "policy-refused");
    assert_eq!(default.body["check"], "init", "{:?}", default.body);
    let too_much = put("?memory_limit_bytes=1099511627776").await;
    assert_problem(&too_much, 422, "policy-refused");
    assert_eq!(too_much.body["check"], "grants", "{:?}", too_much.body);
    let too_little_fuel = put("?call_fuel=10").await;
    assert_eq!(
        too_little_fuel.body["check"], "grants",
        "{:?}",
        too_little_fuel.body
    );
    let granted = put("?memory_limit_bytes=67108864").await;
    assert_eq!(granted.status, 201, "{:?}", granted.body);
    assert_eq!(granted.body["memory_limit_bytes"], 67108864);
    let version = granted.body["version"].as_u64().unwrap();
    let activated = post_json(
        &client,
        &server.endpoint("/v1/policies/retry/activate"),
        &json!({"version": version}),
    )
    .await;
    assert_eq!(activated.status, 200, "{:?}", activated.body);

    // After a restart the version is loaded with its grant again, and decides.
    assert!(server.terminate().success());
    let server = Server::start(&data);
    let detail = get_json(&client, &server.endpoint("/v1/policies/retry")).await;
    assert_eq!(detail.body["active_version"], version, "{:?}", detail.body);
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan"}),
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
        json!({"lease_token": token, "class": "transient"}),
    )
    .await;
    assert_eq!(failed.body["state"], "retry_wait", "{:?}", failed.body);
    // The hostile policy's own delay (1000 + now % 1000), not the built-in's backoff.
    let delay = failed.body["not_before_ms"].as_u64().unwrap()
        - failed.body["updated_at_ms"].as_u64().unwrap();
    assert!((1000..2000).contains(&delay), "{delay}");
    let counters = get_json(&client, &server.endpoint("/v1/policies/retry")).await;
    assert_eq!(counters.body["faults_total"], 0, "{:?}", counters.body);
}

/// The acceptance's first rule: `sluice policy new priority` writes a policy on names whose
/// own unit tests pass natively; built, checked, uploaded with `urgent_prefixes=oct.` and
/// activated through the CLI, it puts a task of kind `oct.qa` submitted low in urgent, keeps
/// `ct.scan` low, and moves an `ed=true` task to urgent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_policy_from_the_template_reads_kinds_and_labels_live() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    succeeded(sluice(&[
        "policy", "new", "priority", "by-kind", "--dir", path,
    ]));
    let project = dir.path().join("by-kind");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tested = std::process::Command::new(env!("CARGO"))
        .args(["test", "--quiet", "--target-dir"])
        .arg(root.join("target/policies-tests-native"))
        .current_dir(&project)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap();
    let test_output = String::from_utf8_lossy(&tested.stdout);
    assert!(
        tested.status.success() && test_output.contains("2 passed"),
        "the template's own tests: {test_output}{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let file = dir.path().join("by_kind.wasm");
    std::fs::write(&file, build_policy_project(&project, "by-kind")).unwrap();
    let file = file.to_str().unwrap();
    let config = ["--config", "urgent_prefixes=oct."];
    let checked = succeeded(sluice(&[&["policy", "check", file][..], &config].concat()));
    assert!(checked.contains("is a priority policy"), "{checked}");
    // The project's own case table passes with the setting its README gives.
    let cases = project.join("cases.toml");
    let test = [
        &["policy", "test", file, "--cases", cases.to_str().unwrap()][..],
        &config,
    ];
    let tested = succeeded(sluice(&test.concat()));
    assert!(tested.contains("3 cases pass"), "{tested}");

    let server = Server::start(&dir.path().join("data"));
    let upload = [
        &[
            "policy",
            "upload",
            "--server",
            &server.url,
            "priority",
            file,
        ][..],
        &config,
    ]
    .concat();
    let uploaded: Value = serde_json::from_str(&succeeded(sluice(&upload))).unwrap();
    let version = uploaded["version"].as_u64().unwrap().to_string();
    let activate = [
        "policy",
        "activate",
        "--server",
        &server.url,
        "priority",
        &version,
    ];
    succeeded(sluice(&activate));

    let client = http();
    let bucket_of = async |spec: Value| {
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &spec).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        created.body["bucket"].as_str().unwrap().to_owned()
    };
    assert_eq!(
        bucket_of(json!({"kind": "oct.qa", "priority": "low"})).await,
        "urgent"
    );
    assert_eq!(
        bucket_of(json!({"kind": "ct.scan", "priority": "low"})).await,
        "low"
    );
    assert_eq!(
        bucket_of(json!({"kind": "ct.scan", "priority": "low", "labels": {"ed": "true"}})).await,
        "urgent"
    );
}

/// A file that cannot be a policy is refused in at most two lines that say what it is, by the
/// CLI (non-zero exit) and over HTTP (422 problem+json), never with its bytes dumped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_names_what_the_file_is_in_two_lines_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let random: Vec<u8> = (0..300u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 0x80)
        .collect();
    let priority = policy_component("by-name", Some("priority"));
    let cases = [
        (
            write("random.bin", &random),
            None,
            "not WebAssembly: 300 bytes",
        ),
        (
            write("notes.txt", b"hello policy\n"),
            None,
            "text beginning `hello policy`",
        ),
        (
            write("core.wasm", b"\0asm\x01\0\0\0"),
            None,
            "a core WebAssembly module, not a component",
        ),
        (
            write("core.wasm", b"\0asm\x01\0\0\0"),
            Some("retry"),
            "cargo build --release --target wasm32-wasip2",
        ),
        (
            write("p.wasm", &priority),
            Some("retry"),
            "a priority policy, not a retry one",
        ),
    ];
    for (file, kind, expected) in &cases {
        let mut args = vec!["policy", "check", file.as_str()];
        if let Some(kind) = kind {
            args.extend(["--kind", kind]);
        }
        let refused = sluice(&args);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{file} {kind:?} passed");
        assert!(stderr.contains(expected), "{file} {kind:?}: {stderr}");
        assert!(
            stderr.trim().lines().count() <= 2,
            "{file} {kind:?}: {stderr}"
        );
        assert!(!stderr.contains("0x"), "{stderr}");
    }

    let server = Server::start(&dir.path().join("data"));
    let client = http();
    let core = put_policy(&client, &server, "retry", b"\0asm\x01\0\0\0".to_vec(), None).await;
    assert_problem(&core, 422, "policy-refused");
    let detail = core.body["detail"].as_str().unwrap();
    assert!(detail.contains("a core WebAssembly module"), "{detail}");
    let wrong = put_policy(&client, &server, "retry", priority, None).await;
    assert_problem(&wrong, 422, "policy-refused");
    let detail = wrong.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("a priority policy, not a retry one"),
        "{detail}"
    );
}

/// `sluice policy test` runs a component against a case table offline: every case right is
/// exit 0; one wrong expectation is exit 1 with a diff naming that case; a malformed table is
/// refused with its line. Priority, aging and retry (policies/by-name) alike.
#[test]
fn policy_test_prints_a_diff_naming_each_case_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let run = |kind: &str, cases: &str| {
        let component = dir.path().join(format!("{kind}.wasm"));
        if !component.exists() {
            std::fs::write(&component, policy_component("by-name", Some(kind))).unwrap();
        }
        let table = dir.path().join(format!("{kind}.toml"));
        std::fs::write(&table, cases).unwrap();
        let args = ["policy", "test", component.to_str().unwrap(), "--cases"];
        sluice(&[&args[..], &[table.to_str().unwrap()]].concat())
    };
    let priority = r#"
[[case]]
name = "oct kinds are urgent"
task = { kind = "oct.qa", priority = "low" }
expect = { bucket = "urgent" }

[[case]]
name = "the ER's tenant is urgent"
task = { kind = "ct.scan", priority = "low", tenant = "site-er", seq = 4 }
expect = { bucket = "urgent", rank = 4 }

[[case]]
name = "a plain scan keeps its bucket"
task = { kind = "ct.scan", priority = "low", tenant = "site-a", est_exec_ms = 500 }
expect = { bucket = "low", attempt_timeout_ms = 1000 }
"#;
    let passed = succeeded(run("priority", priority));
    assert!(passed.contains("3 cases pass"), "{passed}");

    let wrong = priority.replace(
        r#"expect = { bucket = "low", attempt_timeout_ms = 1000 }"#,
        r#"expect = { bucket = "normal", attempt_timeout_ms = 1000 }"#,
    );
    let failed = run("priority", &wrong);
    assert_eq!(failed.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&failed.stdout);
    assert!(
        stdout.contains("FAIL case 3 (a plain scan keeps its bucket)")
            && stdout.contains("- bucket: normal")
            && stdout.contains("+ bucket: low"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("case 1") && !stdout.contains("case 2"),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&failed.stderr).contains("1 of 3 cases differ"));

    let aging = r#"
[[case]]
name = "an emergency waiting low moves up"
task = { kind = "ct.scan", priority = "low", labels = { ed = "true" }, waited_ms = 1000 }
expect = { promote = "normal" }

[[case]]
name = "anything else stays"
task = { kind = "ct.scan", priority = "low" }
expect = { promote = "none" }
"#;
    assert!(succeeded(run("aging", aging)).contains("2 cases pass"));
    let retry = r#"
[[case]]
name = "an emergency is retried after its device name's length"
task = { kind = "ct.scan", device = "scanner-7", labels = { ed = "true" }, attempt = 1 }
failure = { class = "transient" }
expect = { retry_after_ms = 9 }

[[case]]
name = "anything else is given up"
task = { kind = "ct.scan", attempt = 1 }
failure = { class = "node-busy" }
expect = { dead = "policy" }
"#;
    assert!(succeeded(run("retry", retry)).contains("2 cases pass"));

    let malformed = run(
        "retry",
        "[[case]]\nname = \"x\"\ntask = { kind = \"a\", priorty = \"low\" }\nexpect = {}\n",
    );
    assert_eq!(malformed.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&malformed.stderr);
    assert!(
        stderr.contains("line 3") && stderr.contains("priorty"),
        "{stderr}"
    );
}
