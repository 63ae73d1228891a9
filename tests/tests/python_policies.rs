//! Policies in a second language: the Python examples in `policies/examples/python` (a retry
//! and an aging policy on the SDK module beside them) built with componentize-py, checked
//! with `sluice policy check`, uploaded, activated and seen deciding on a real server; a split
//! policy that is told the collection's layout, through the runtime; and
//! `sluice policy new --lang python` writes a project that builds and checks.
//!
//! componentize-py comes from PyPI (`.ci/run` installs it). Without it these tests say so and
//! pass, unless `SLUICE_REQUIRE_COMPONENTIZE_PY=1` (set by `.ci/run`) makes them fail.

use sluice_tests::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/examples/python")
}

/// Builds the example `name` (its directory) as a component of `world` into `dir`.
fn build_example(componentize_py: &Path, name: &str, world: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("{name}.wasm"));
    let example = examples().join(name);
    let sdk = examples().join("sdk");
    build_python_policy(componentize_py, world, &[&example, &sdk], &out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_retry_and_aging_policies_pass_conformance_and_decide_live() {
    let Some(componentize_py) = componentize_py() else {
        eprintln!("SKIPPED: no componentize-py (pip install componentize-py)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // The two builds take about 15 s each; they run side by side.
    let (retry, aging) = std::thread::scope(|scope| {
        let retry = scope
            .spawn(|| build_example(&componentize_py, "retry-linear", "retry-policy", dir.path()));
        let aging = build_example(
            &componentize_py,
            "aging-threshold",
            "aging-policy",
            dir.path(),
        );
        (retry.join().unwrap(), aging)
    });
    for (file, kind) in [(&retry, "retry"), (&aging, "aging")] {
        let checked = succeeded(run_sluice(
            &["policy", "check", file.to_str().unwrap()],
            &[],
        ));
        assert!(
            checked.contains(&format!("is a {kind} policy")),
            "{checked}"
        );
    }
    // A config the Python code refuses is refused with its own message.
    let refused = run_sluice(
        &[
            "policy",
            "check",
            retry.to_str().unwrap(),
            "--config",
            "delay_ms=0",
        ],
        &[],
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("delay_ms must be at least 1"), "{stderr}");

    // The server compiles an 18 MiB interpreter per upload, in this debug build; beside other
    // work on the machine that has taken over the default minute, so the bound is raised.
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "request_timeout_ms = 600000\n").unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let client = http();
    // Retry: a transient failure waits 1 x delay_ms (no jitter), a busy node
    // node_busy_delay_ms; the built-in policy would draw up to 5 minutes of jitter.
    let retry_version = upload_and_activate(
        &server,
        "retry",
        &retry,
        &["delay_ms=4242", "jitter_ms=0", "node_busy_delay_ms=777"],
    );
    for _ in 0..2 {
        let submitted = post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "oct.scan", "max_attempts": 3}),
        )
        .await;
        assert_eq!(submitted.status, 201, "{:?}", submitted.body);
    }
    register_worker(&client, &server, "gpu-1", 2).await;
    for (class, expected_ms) in [("transient", 4242), ("node-busy", 777)] {
        let lease = claim_lease(&client, &server, "gpu-1").await;
        let id = lease["task"]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{lease:?}"));
        let token = lease["lease_token"].as_str().unwrap();
        let failed = report(
            &client,
            &server,
            id,
            "fail",
            json!({"lease_token": token, "class": class, "message": "busy"}),
        )
        .await;
        assert_eq!(failed.body["state"], "retry_wait", "{:?}", failed.body);
        let delay = failed.body["not_before_ms"].as_u64().unwrap()
            - failed.body["updated_at_ms"].as_u64().unwrap();
        assert_eq!(delay, expected_ms, "{class}: {:?}", failed.body);
    }
    let status = get_json(&client, &server.endpoint("/v1/policies/retry")).await;
    assert_eq!(status.body["active_version"], retry_version);
    assert_eq!(status.body["faults_total"], 0, "{:?}", status.body);

    // Aging: a low task moves to normal after 1 ms in its bucket, at the next aging tick.
    let aging_version = upload_and_activate(
        &server,
        "aging",
        &aging,
        &["low_to_normal_ms=1", "normal_to_urgent_ms=86400000"],
    );
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.report", "priority": "low"}),
    )
    .await;
    let id = submitted.body["id"].as_str().unwrap().to_owned();
    let events = server.endpoint(&format!("/v1/tasks/{id}/events"));
    let by = format!("promoted low → normal by aging policy v{aging_version}");
    wait_for(
        "the Python aging policy's promotion",
        Duration::from_secs(30),
        || {
            let (client, events, by) = (client.clone(), events.clone(), by.clone());
            async move {
                let answer = get_json(&client, &events).await;
                let promoted = answer.body["events"]
                    .as_array()?
                    .iter()
                    .any(|e| e["detail"].as_str() == Some(by.as_str()));
                promoted.then_some(())
            }
        },
    )
    .await;
    let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(task.body["bucket"], "normal", "{:?}", task.body);
    // The task waits in normal now, far from the day it needs to move again.
    let status = get_json(&client, &server.endpoint("/v1/policies/aging")).await;
    assert_eq!(status.body["faults_total"], 0, "{:?}", status.body);
}

/// The SDK's own tests (settings of every shape), natively: they need python3 only.
#[test]
fn the_python_sdks_settings_read_lists_and_maps_and_refuse_bad_shapes() {
    let output = std::process::Command::new("python3")
        .arg("test_sluice_policy.py")
        .current_dir(examples().join("sdk"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout.matches(" passed").count(), 3, "{stdout}");
}

#[test]
fn policy_new_writes_a_python_project_that_builds_and_checks() {
    let Some(componentize_py) = componentize_py() else {
        eprintln!("SKIPPED: no componentize-py (pip install componentize-py)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let base = [
        "policy", "new", "retry", "my-retry", "--lang", "python", "--dir",
    ];
    let created = succeeded(run_sluice(
        &[&base[..], &[dir.path().to_str().unwrap()]].concat(),
        &[],
    ));
    let project = PathBuf::from(created.trim());
    assert!(project.join("app.py").exists() && project.join("sluice_policy.py").exists());
    // The project's own WIT, as its README's command uses it.
    let out = dir.path().join("my-retry.wasm");
    let built = std::process::Command::new(&componentize_py)
        .current_dir(&project)
        .args([
            "-d",
            "wit",
            "-w",
            "named-retry-policy",
            "componentize",
            "app",
            "-p",
            ".",
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let checked = succeeded(run_sluice(&["policy", "check", out.to_str().unwrap()], &[]));
    assert!(checked.contains("is a retry policy"), "{checked}");
    // Kinds the Python SDK does not cover are refused with what to do instead.
    let merge = run_sluice(
        &[
            "policy",
            "new",
            "merge",
            "m",
            "--lang",
            "python",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(!merge.status.success());
    assert!(String::from_utf8_lossy(&merge.stderr).contains("in rust"));
}

/// A split policy in Python sees the collection's layout through `split-layout` (its live
/// shards), passes conformance, and answers 0.1.0's `split` too, without the layout.
#[test]
fn a_python_split_policy_sees_the_collections_layout() {
    use sluice_policy_runtime::bindings::split::sluice::policy::types::{
        Bucket, TaskMeta, TaskView,
    };
    use sluice_policy_runtime::bindings::split_layout::{Layout, ShardFilter, SplitRequest};
    use sluice_policy_runtime::{Conformance, Kind, PolicyRuntime, RuntimeOptions, SplitInstance};
    let Some(componentize_py) = componentize_py() else {
        eprintln!("SKIPPED: no componentize-py (pip install componentize-py)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = build_example(
        &componentize_py,
        "split-live-shards",
        "split-layout-policy",
        dir.path(),
    );
    let runtime = std::sync::Arc::new(PolicyRuntime::new(RuntimeOptions::default()).unwrap());
    let compiled = runtime
        .compile(Kind::Split, &std::fs::read(&file).unwrap())
        .unwrap();
    let mut split = SplitInstance::new(runtime, &compiled, b"").unwrap();
    split.conformance().unwrap();
    let request = |live: Vec<u32>| SplitRequest {
        task: TaskMeta {
            view: TaskView {
                seq: 1,
                tenant: 0,
                kind: 0,
                bucket: Bucket::Normal,
                submitted_bucket: Bucket::Normal,
                created_ms: 0,
                bucket_since_ms: 0,
                attempt: 0,
                est_exec_ms: 0,
            },
            kind_name: "vector.search".into(),
            tenant_name: "t".into(),
            device: "d".into(),
            labels: Vec::new(),
        },
        vector: vec![0.5; 4],
        k: 10,
        nprobe: 0,
        layout: Layout {
            collection: "docs".into(),
            dim: 4,
            shards: 4,
            live,
        },
    };
    let children = split.split(&request(vec![0, 2, 3])).unwrap().unwrap();
    let shards: Vec<ShardFilter> = children.into_iter().map(|c| c.filter).collect();
    assert_eq!(
        shards,
        [
            ShardFilter::Shard(0),
            ShardFilter::Shard(2),
            ShardFilter::Shard(3)
        ]
    );
    let refused = split.split(&request(Vec::new())).unwrap().unwrap_err();
    assert!(refused.contains("collection `docs`"), "{refused}");
}

/// The acceptance's first rule in Python: `sluice policy new priority --lang python` writes a
/// policy on names whose unit tests pass natively; built with its README's command, uploaded
/// with `urgent_prefixes=oct.` and activated, it puts a task of kind `oct.qa` submitted low in
/// urgent and keeps `ct.scan` low.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_priority_policy_from_the_template_reads_kinds_live() {
    let Some(componentize_py) = componentize_py() else {
        eprintln!("SKIPPED: no componentize-py (pip install componentize-py)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let new = [
        "policy", "new", "priority", "by-kind", "--lang", "python", "--dir", path,
    ];
    let project = PathBuf::from(succeeded(run_sluice(&new, &[])).trim());
    let tested = std::process::Command::new("python3")
        .arg("test_app.py")
        .current_dir(&project)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&tested.stdout);
    assert!(
        tested.status.success() && said.matches("passed").count() == 2,
        "{said}{}",
        String::from_utf8_lossy(&tested.stderr)
    );
    let out = dir.path().join("by-kind.wasm");
    let built = std::process::Command::new(&componentize_py)
        .current_dir(&project)
        .args([
            "-d",
            "wit",
            "-w",
            "named-priority-policy",
            "componentize",
            "app",
        ])
        .args(["-p", ".", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let server = Server::start(&dir.path().join("data"));
    upload_and_activate(&server, "priority", &out, &["urgent_prefixes=oct."]);
    let client = http();
    for (kind, bucket) in [("oct.qa", "urgent"), ("ct.scan", "low")] {
        let spec = json!({"kind": kind, "priority": "low"});
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &spec).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        assert_eq!(created.body["bucket"], bucket, "{kind}: {:?}", created.body);
    }
}

#[test]
fn a_python_merge_policy_passes_conformance_and_refuses_a_bad_bound_with_its_message() {
    let Some(componentize_py) = componentize_py() else {
        eprintln!("SKIPPED: no componentize-py (pip install componentize-py)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let merge = build_example(&componentize_py, "merge-topk", "merge-policy", dir.path());
    let file = merge.to_str().unwrap();
    let checked = succeeded(run_sluice(
        &["policy", "check", file, "--config", "max_distance=0.8"],
        &[],
    ));
    assert!(checked.contains("is a merge policy"), "{checked}");
    let refused = run_sluice(
        &["policy", "check", file, "--config", "max_distance=far"],
        &[],
    );
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("max_distance: `far` is not a distance"),
        "{said}"
    );
}
