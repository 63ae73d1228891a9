//! The `sluice` command line against a running server, its configuration sources, and its
//! errors: a message on stderr and a non-zero exit.

use sluice_tests::*;
use std::process::{Command, Output, Stdio};

fn sluice(args: &[&str]) -> Output {
    Command::new(sluice_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run sluice")
}

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

#[test]
fn submit_get_list_events_cancel_from_the_shell() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let url = server.url.as_str();
    let submit = [
        "submit",
        "--server",
        url,
        "--kind",
        "oct.analyze",
        "--priority",
        "low",
        "--key",
        "exam-9",
        "--label",
        "site=b",
        "--payload",
        r#"{"eye":"right"}"#,
    ];
    let task = stdout_json(&sluice(&submit));
    assert_eq!(task["state"], "queued");
    assert_eq!(task["priority"], "low");
    assert_eq!(task["labels"]["site"], "b");
    let id = task["id"].as_str().unwrap();
    // Resending is answered with the same task and a note on stderr.
    let replay = sluice(&submit);
    assert_eq!(stdout_json(&replay)["id"], json!(id));
    assert!(String::from_utf8_lossy(&replay.stderr).contains("already named this task"));

    let read = stdout_json(&sluice(&["task", "get", "--server", url, id]));
    assert_eq!(read["payload"]["eye"], "right");
    let listed = stdout_json(&sluice(&[
        "task", "list", "--server", url, "--state", "queued", "--limit", "5",
    ]));
    assert_eq!(listed["tasks"][0]["id"], json!(id));
    // A reader that has gone away (`sluice task list | head -0`) ends the command quietly:
    // no panic, no error, exit 0. The pipe's read end is closed before the command starts,
    // so its first write fails.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let closed = Command::new(sluice_binary())
        .args(["task", "list", "--server", url])
        .stdin(Stdio::null())
        .stdout(writer)
        .output()
        .expect("run sluice");
    let stderr = String::from_utf8_lossy(&closed.stderr);
    assert!(closed.status.success(), "{:?}: {stderr}", closed.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let cancelled = stdout_json(&sluice(&["task", "cancel", "--server", url, id]));
    assert_eq!(cancelled["state"], "cancelled");
    let events = stdout_json(&sluice(&["task", "events", "--server", url, id]));
    assert_eq!(events["events"].as_array().unwrap().len(), 3);

    // Errors: the server's problem on stderr, non-zero exit, nothing on stdout.
    for args in [
        vec!["task", "cancel", "--server", url, id],
        vec!["task", "get", "--server", url, "not-an-id"],
        vec!["task", "list", "--server", url, "--state", "asleep"],
        vec![
            "submit",
            "--server",
            url,
            "--kind",
            "k",
            "--payload",
            "{broken",
        ],
        vec![
            "submit",
            "--server",
            url,
            "--kind",
            "k",
            "--priority",
            "asap",
        ],
        vec!["task", "get", "--server", "http://127.0.0.1:1", id],
    ] {
        let output = sluice(&args);
        assert!(!output.status.success(), "{args:?} should fail");
        assert!(
            output.stdout.is_empty(),
            "{args:?} printed {:?}",
            String::from_utf8_lossy(&output.stdout)
        );
        assert!(!output.stderr.is_empty(), "{args:?} said nothing");
    }
}

#[test]
fn serve_reads_a_config_file_and_environment_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let from_file = dir.path().join("from-file");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nlisten = \"127.0.0.1:1\"\nmax_payload_bytes = 64\n",
            from_file
        ),
    )
    .unwrap();
    // SLUICE_LISTEN overrides the file's unusable port; the file's data dir and limit apply.
    // Killed on drop, so a failed assertion leaves no server behind.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Command::new(sluice_binary())
        .args(["serve", "--config"])
        .arg(&config)
        .env("SLUICE_LISTEN", "127.0.0.1:0")
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = KillOnDrop(child);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .expect("announce line")
        .to_owned();
    assert!(
        from_file.join("db").exists(),
        "the data dir comes from the file"
    );
    let too_big = sluice(&[
        "submit",
        "--server",
        &url,
        "--kind",
        "k",
        "--payload",
        &format!("\"{}\"", "x".repeat(100)),
    ]);
    assert!(!too_big.status.success());
    assert!(String::from_utf8_lossy(&too_big.stderr).contains("413"));
    drop(child);

    // A config file with an unknown key, or an unusable value, stops serve with a message.
    std::fs::write(&config, "listen_address = \"127.0.0.1:0\"\n").unwrap();
    let output = sluice(&["serve", "--config", config.to_str().unwrap()]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("listen_address"));
    let output = sluice(&["serve", "--listen", "nonsense"]);
    assert!(!output.status.success());
}

#[test]
fn policy_upload_activate_list_rollback_from_the_shell() {
    let component = policy_component("retry-backoff", None);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("retry.wasm");
    std::fs::write(&file, component).unwrap();
    let server = Server::start(&dir.path().join("data"));
    let url = server.url.as_str();
    let file = file.to_str().unwrap();

    let uploaded = stdout_json(&sluice(&[
        "policy",
        "upload",
        "--server",
        url,
        "retry",
        file,
        "--config",
        "initial_delay_ms=1000",
        "--config",
        "max_delay_ms=5000",
    ]));
    assert_eq!(uploaded["version"], 1);
    assert_eq!(
        uploaded["config"],
        "initial_delay_ms=1000\nmax_delay_ms=5000"
    );
    let active = stdout_json(&sluice(&[
        "policy", "activate", "--server", url, "retry", "1",
    ]));
    assert_eq!(active["active_version"], 1);
    let listed = stdout_json(&sluice(&["policy", "list", "--server", url]));
    let retry = listed["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["kind"] == "retry")
        .unwrap();
    assert_eq!(retry["active_version"], 1);
    let detail = stdout_json(&sluice(&["policy", "list", "--server", url, "retry"]));
    assert_eq!(detail["versions"].as_array().unwrap().len(), 1);
    let rolled = stdout_json(&sluice(&["policy", "rollback", "--server", url, "retry"]));
    assert_eq!(rolled["active_version"], 0);

    // Errors: a message on stderr and a non-zero exit.
    let refused = sluice(&["policy", "rollback", "--server", url, "retry"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("roll back"));
    let wrong_kind = sluice(&["policy", "upload", "--server", url, "merge", file]);
    assert!(!wrong_kind.status.success());
    assert!(String::from_utf8_lossy(&wrong_kind.stderr).contains("world"));
    let missing = sluice(&[
        "policy",
        "upload",
        "--server",
        url,
        "retry",
        "/nonexistent.wasm",
    ]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read"));
}

#[test]
fn serve_refuses_a_policy_setting_its_component_does_not_know() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let output = sluice(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data,
        "--policy-config",
        "retry.initial_delay=5",
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("retry") && stderr.contains("initial_delay"),
        "{stderr}"
    );
    let malformed = sluice(&["serve", "--data-dir", data, "--policy-config", "retry"]);
    assert!(!malformed.status.success());
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("kind.name=value"));
}

#[test]
fn worker_and_serve_refuse_bad_dispatch_settings_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let cases: [(&[&str], &str); 10] = [
        (
            &["worker", "--id", "w", "--fail-rate", "1.5"],
            "--fail-rate",
        ),
        (
            &[
                "worker",
                "--id",
                "w",
                "--batch-size",
                "8",
                "--max-concurrency",
                "4",
            ],
            "--max-concurrency 4 is below --batch-size 8",
        ),
        (
            &[
                "worker",
                "--id",
                "w",
                "--batch-size",
                "8",
                "--batch-alpha",
                "-0.5",
            ],
            "--batch-alpha",
        ),
        (&["bench", "batch", "--rate", "0"], "--rate"),
        (&["bench", "batch", "--exec-ms", "0"], "--exec-ms"),
        (
            &["sim", "--trace", "/nonexistent.jsonl", "--batch", "8:20:5"],
            "--batch: `8:20:5`",
        ),
        (&["worker", "--id", "bad id"], "worker id"),
        (
            &["worker", "--id", "w", "--fail-class", "lease-expired"],
            "transient",
        ),
        (&["worker", "--id", "w", "--labels", "site"], "k=v"),
        (
            &["serve", "--data-dir", data, "--lease-ms", "5"],
            "lease_ms",
        ),
    ];
    for (args, expected) in cases {
        let output = sluice(args);
        assert!(!output.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn the_demo_runs_its_load_to_the_end_and_prints_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("demo");
    let output = sluice(&[
        "demo",
        "--tasks",
        "60",
        "--searches",
        "12",
        "--pace-s",
        "1",
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("== Summary"), "{stdout}");
    assert!(stdout.contains("tasks submitted: completed 72"), "{stdout}");
    assert!(
        stdout.contains("12 split into shards and merged; recall@10 against exact search 1.000"),
        "{stdout}"
    );
    // The state stays where it was asked to be, for a later `sluice serve --data-dir`.
    assert!(data_dir.read_dir().unwrap().next().is_some());

    let refused = sluice(&["demo", "--tasks", "0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--tasks"));
}

/// `main` turns transparent huge pages off for the process (see its comment for why); the
/// kernel says so in the process's status (Linux 5.0 and later).
#[cfg(target_os = "linux")]
#[test]
fn serve_runs_with_transparent_huge_pages_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("THP_enabled:"))
        .expect("a THP_enabled line in /proc/PID/status");
    assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
}

/// `sluice bench skip-locked`, the PostgreSQL baseline, directly and behind its HTTP front:
/// every job inserted is claimed and completed once (the bench fails otherwise).
#[test]
fn the_skip_locked_baseline_completes_every_job_directly_and_over_http() {
    let Some(url) = postgres_server() else { return };
    for http in [false, true] {
        let mut args = vec!["bench", "skip-locked", "--store", &url, "--tasks", "700"];
        if http {
            args.push("--http");
        }
        let printed = succeeded(run_sluice(&args, &[]));
        assert!(printed.contains("700 jobs"), "{printed}");
        assert_eq!(printed.contains("behind HTTP"), http, "{printed}");
        assert!(printed.contains("jobs/s "), "{printed}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_submits_the_asked_count_in_the_asked_mix_and_prints_the_latency() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let output = sluice(&[
        "load",
        "--server",
        &server.url,
        "--rate",
        "200",
        "--duration-s",
        "2",
        "--mix",
        "urgent=1,low=1",
        "--devices",
        "4",
        "--tenants",
        "2",
        "--kind",
        "oct.qa",
        "--kind",
        "ct.scan",
        "--label",
        "ed=true",
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("sent 400 tasks"), "{stdout}");
    assert!(
        stdout.contains("acknowledged 400, refused 0, unanswered 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("acknowledgement latency from each task's due time: p50 "),
        "{stdout}"
    );

    let tasks = all_tasks(&http(), &server).await;
    assert_eq!(tasks.len(), 400);
    let mut by_priority = std::collections::BTreeMap::new();
    for task in &tasks {
        *by_priority
            .entry(task["priority"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
        let device = task["device"].as_str().unwrap();
        let n: u32 = device
            .strip_prefix("load-device-")
            .unwrap()
            .parse()
            .unwrap();
        assert!(n < 4);
        assert_eq!(task["tenant"], format!("load-site-{}", n % 2));
        assert!(["oct.qa", "ct.scan"].contains(&task["kind"].as_str().unwrap()));
        assert_eq!(task["labels"]["ed"], "true");
    }
    // Half urgent, half low, none normal: the seeded draw lands near the shares.
    assert!(!by_priority.contains_key("normal"), "{by_priority:?}");
    assert!(
        (150..=250).contains(&by_priority["urgent"]),
        "{by_priority:?}"
    );
}

#[test]
fn load_refuses_bad_settings_with_a_message() {
    for (args, says) in [
        (&["--mix", "urgent=0"][..], "add up to 0"),
        (&["--mix", "soon=1"][..], "not a priority"),
        (&["--mix", "urgent=1,urgent=2"][..], "named twice"),
        (&["--rate", "0"][..], "--rate must be"),
        (
            &["--rate", "100000", "--duration-s", "1000"][..],
            "at most 10000000",
        ),
        (&["--devices", "0"][..], "at least 1"),
    ] {
        let mut all = vec!["load", "--server", "http://127.0.0.1:9"];
        all.extend_from_slice(args);
        let output = sluice(&all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(stderr.lines().count() <= 3, "{stderr}");
    }
}
