//! Policies in JavaScript: `sluice policy new --lang js` writes a project whose unit tests pass
//! under node's own runner and whose `npm run build` (componentize-js, from npm) makes a
//! component that checks, uploads (a setting it refuses refused with its own message),
//! activates and decides live: the `oct.` kind rule, a label rule and a JSON setting for
//! priority; a retry policy deciding a real failure.
//!
//! `.ci/run` installs componentize-js and sets `SLUICE_COMPONENTIZE_JS` to its folder. Without
//! it these tests say so and pass, unless `SLUICE_REQUIRE_COMPONENTIZE_JS=1` (set by `.ci/run`)
//! makes them fail.

use sluice_tests::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One JavaScript test at a time: each compiles 12 MB components in a debug build, and two
/// side by side on a 2-core machine beside other work can pass the server's request timeout.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A server whose requests may take 5 minutes: an upload compiles the component (about half a
/// minute in a debug build, more on a busy machine; a release build takes a few seconds).
fn start(dir: &Path) -> Server {
    Server::start_with(&dir.join("data"), &["--request-timeout-ms", "300000"])
}

/// `sluice policy new KIND NAME --lang js` in `dir`, its unit tests run (`npm test`), then
/// `npm run build`: the project and its component.
fn new_tested_built(kind: &str, name: &str, dir: &Path, path_var: &str) -> (PathBuf, PathBuf) {
    let path = dir.to_str().unwrap();
    let new = ["policy", "new", kind, name, "--lang", "js", "--dir", path];
    let project = PathBuf::from(succeeded(run_sluice(&new, &[])).trim());
    let npm = |script: &str| {
        let ran = Command::new("npm")
            .args(["run", "--silent", script])
            .current_dir(&project)
            .env("PATH", path_var)
            .output()
            .expect("run npm");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&ran.stdout),
            String::from_utf8_lossy(&ran.stderr)
        );
        assert!(ran.status.success(), "npm run {script}: {said}");
        said
    };
    let tested = npm("test");
    assert!(
        tested.contains("# fail 0") && !tested.contains("# pass 0"),
        "{tested}"
    );
    npm("build");
    let component = project.join(format!("{name}.wasm"));
    assert!(component.exists(), "npm run build wrote no {name}.wasm");
    (project, component)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_priority_policy_from_the_template_reads_kinds_labels_and_json_settings_live()
{
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(path_var) = componentize_js_path() else {
        eprintln!("SKIPPED: no componentize-js (npm install @bytecodealliance/componentize-js)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_project, component) = new_tested_built("priority", "by-kind", dir.path(), &path_var);
    // Each compile of a 12 MB component takes half a minute in a debug build: one here, one
    // at the server (whose code cache serves the second upload of the same bytes).
    let file = component.to_str().unwrap();
    let checked = succeeded(run_sluice(
        &["policy", "check", file, "--config", "urgent_prefixes=oct."],
        &[],
    ));
    assert!(checked.contains("is a priority policy"), "{checked}");
    let server = start(dir.path());
    // The setting the JavaScript refuses, refused with its own message.
    let refused = run_sluice(
        &[
            "policy",
            "upload",
            "--server",
            &server.url,
            "priority",
            file,
            "--config",
            r#"sites={"site-er": "soon"}"#,
        ],
        &[],
    );
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("a bucket is urgent, normal or low"), "{said}");
    upload_and_activate(
        &server,
        "priority",
        &component,
        &["urgent_prefixes=oct.", r#"sites={"site-er": "normal"}"#],
    );
    let client = http();
    for (spec, bucket) in [
        (json!({"kind": "oct.qa", "priority": "low"}), "urgent"),
        (json!({"kind": "ct.scan", "priority": "low"}), "low"),
        (
            json!({"kind": "ct.scan", "priority": "low", "labels": {"ed": "true"}}),
            "urgent",
        ),
        (
            json!({"kind": "ct.scan", "priority": "low", "tenant": "site-er"}),
            "normal",
        ),
    ] {
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &spec).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        assert_eq!(created.body["bucket"], bucket, "{spec}: {:?}", created.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_retry_policy_from_the_template_decides_a_real_failure() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(path_var) = componentize_js_path() else {
        eprintln!("SKIPPED: no componentize-js (npm install @bytecodealliance/componentize-js)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_project, component) = new_tested_built("retry", "steady", dir.path(), &path_var);
    let server = start(dir.path());
    upload_and_activate(&server, "retry", &component, &["delay_ms=60000"]);
    let client = http();
    let created = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.qa", "priority": "normal", "max_attempts": 3}),
    )
    .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_str().unwrap().to_owned();
    register_worker(&client, &server, "gpu-0", 1).await;
    let lease = claim_lease(&client, &server, "gpu-0").await;
    let failed = report(
        &client,
        &server,
        &id,
        "fail",
        json!({"lease_token": lease["lease_token"], "class": "transient", "message": "cuda oom"}),
    )
    .await;
    assert_eq!(failed.status, 200, "{:?}", failed.body);
    let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(task.body["state"], "retry_wait", "{:?}", task.body);
    // The JavaScript's rule: 60,000 ms times the attempt number, 1.
    let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
    let text = events.body.to_string();
    assert!(
        text.contains("attempt 1 failed (transient); retry after 60000 ms, by retry policy v1"),
        "{text}"
    );
}
