//! `sluice trace gen` and `sluice trace import` through the real binary: generated traces
//! replay from their seed, and a CSV the test writes imports through a column mapping.

use sluice_tests::*;

#[test]
fn trace_gen_replays_from_its_seed() {
    let generated = |seed: &str| {
        let args = [
            "trace", "gen", "--tasks", "3000", "--seed", seed, "--shape", "burst",
        ];
        succeeded(run_sluice(&args, &[]))
    };
    let first = generated("5");
    assert_eq!(first, generated("5"), "the same seed writes the same bytes");
    assert_ne!(first, generated("6"));
    let tasks: Vec<Value> = first
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(tasks.len(), 3000);
    let times: Vec<u64> = tasks
        .iter()
        .map(|t| t["submit_ms"].as_u64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in submission order"
    );
    let refused = run_sluice(&["trace", "gen", "--tasks", "0"], &[]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--tasks must be"));
}

#[test]
fn trace_import_reads_a_csv_through_its_column_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("jobs.csv");
    std::fs::write(
        &csv,
        "job,submitted,ran_for,qos,team\n\
         j1,1700000100,20,high,vision\n\
         j2,1700000040,5.5,low,retina\n\
         j3,1700000040,1,mid,vision\n",
    )
    .unwrap();
    let out = dir.path().join("trace.jsonl");
    let columns =
        "submit=submitted,service=ran_for,priority=qos:high=urgent/mid=normal/low=low,tenant=team";
    let csv_arg = csv.to_str().unwrap();
    let out_arg = out.to_str().unwrap();
    let args = [
        "trace",
        "import",
        "--csv",
        csv_arg,
        "--columns",
        columns,
        "--out",
        out_arg,
    ];
    succeeded(run_sluice(&args, &[]));
    let trace = std::fs::read_to_string(&out).unwrap();
    let tasks: Vec<Value> = trace
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(u64, u64, &str, &str)> = tasks
        .iter()
        .map(|t| {
            (
                t["submit_ms"].as_u64().unwrap(),
                t["service_ms"].as_u64().unwrap(),
                t["priority"].as_str().unwrap(),
                t["tenant"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (0, 5_500, "low", "retina"),
            (0, 1_000, "normal", "vision"),
            (60_000, 20_000, "urgent", "vision")
        ]
    );
    // A value the map does not name is refused with its row.
    let unmapped = "submit=submitted,service=ran_for,priority=qos:high=urgent/low=low";
    let args = ["trace", "import", "--csv", csv_arg, "--columns", unmapped];
    let refused = run_sluice(&args, &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("row 4") && stderr.contains("\"mid\""),
        "{stderr}"
    );
}

/// A CSV in the published format of the Alibaba GPU 2023 pod list, imported with the mapping
/// docs/traces.md gives: every row with its three times kept, pods that ran for months clipped
/// to a day and counted, the rest counted by reason; the trace replays to the end.
#[test]
fn the_alibaba_pod_list_imports_with_the_documented_mapping_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("openb_pod_list_default.csv");
    std::fs::write(
        &csv,
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
         openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0\n\
         openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n\
         openb-pod-0033,3152,5600,1,1000,,BE,Failed,9965463,9965645,9965463\n\
         openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,\n\
         openb-pod-0084,11908,47104,1,1000,,BE,Pending,10015849,10015908,\n\
         openb-pod-0129,12000,24576,1,1000,,Guaranteed,Running,10035396,10036353,10035396\n\
         openb-pod-9999,1000,2048,0,0,,BE,Running,10040000,,10040001\n",
    )
    .unwrap();
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/traces.md")).unwrap();
    // The mapping as the docs print it, on the line after `--columns`.
    let columns = docs
        .lines()
        .skip_while(|line| !line.contains("openb_pod_list_default.csv --time-unit s"))
        .find_map(|line| line.trim().strip_prefix("--columns "))
        .expect("docs/traces.md gives the pod list's mapping")
        .trim_end_matches(['\\', ' '])
        .trim_matches('\'')
        .to_owned();
    let out = dir.path().join("openb.jsonl");
    let (csv_arg, out_arg) = (csv.to_str().unwrap(), out.to_str().unwrap());
    let import = |extra: &[&str]| {
        let mut args = vec![
            "trace",
            "import",
            "--csv",
            csv_arg,
            "--time-unit",
            "s",
            "--columns",
            &columns,
            "--out",
            out_arg,
        ];
        args.extend_from_slice(extra);
        run_sluice(&args, &[])
    };
    let refused = import(&[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("row 5: scheduled_time is empty"),
        "{stderr}"
    );
    let imported = import(&["--skip-invalid"]);
    let stderr = String::from_utf8_lossy(&imported.stderr).into_owned();
    succeeded(imported);
    for line in [
        "imported 4 rows",
        "2 rows ran over a day (the longest 145.1 days)",
        "skipped 2 rows: no scheduled_time",
        "skipped 1 rows: no deletion_time",
    ] {
        assert!(stderr.contains(line), "{line:?} in {stderr}");
    }
    let trace = std::fs::read_to_string(&out).unwrap();
    assert_eq!(trace.lines().count(), 4);
    let sim = succeeded(run_sluice(
        &[
            "sim",
            "--trace",
            out_arg,
            "--workers",
            "2x8",
            "--lease-ms",
            "3600000",
        ],
        &[],
    ));
    assert!(sim.contains("completed 4, dead 0"), "{sim}");
}

/// A cluster's CSV the test writes, imported and then simulated with two aging policies: the
/// comparison is printed, report.json and the plots are written, and the same seed prints the
/// same bytes.
#[test]
fn an_imported_csv_is_simulated_with_two_aging_policies() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("cluster.csv");
    // 600 jobs over 10 minutes on a cluster too small for them: low work waits.
    let mut rows = String::from("start,end,prio,user,gpu_mem\n");
    for n in 0..600u64 {
        let start = 1_000 + n;
        let prio = ["0", "1", "1", "2", "2", "2"][n as usize % 6];
        let end = start + 3 + n % 5;
        rows.push_str(&format!("{start},{end},{prio},u{},{}\n", n % 7, 8_000));
    }
    std::fs::write(&csv, rows).unwrap();
    let trace = dir.path().join("trace.jsonl");
    let columns = "submit=start,end=end,priority=prio:0=urgent/1=normal/2=low,tenant=user,gpu_memory_mb=gpu_mem";
    succeeded(run_sluice(
        &[
            "trace",
            "import",
            "--csv",
            csv.to_str().unwrap(),
            "--columns",
            columns,
            "--out",
            trace.to_str().unwrap(),
        ],
        &[],
    ));
    let simulate = |out: &std::path::Path| {
        succeeded(run_sluice(
            &[
                "sim",
                "--trace",
                trace.to_str().unwrap(),
                "--workers",
                "2x2:16000",
                "--policy",
                "aging=builtin:aging-threshold?low_to_normal_ms=30000&normal_to_urgent_ms=600000",
                "--compare",
                "aging=builtin:aging-deadline?low_target_ms=120000&normal_target_ms=60000&headroom_ms=10000",
                "--seed",
                "9",
                "--out",
                out.to_str().unwrap(),
            ],
            &[],
        ))
    };
    let first_dir = dir.path().join("first");
    let stdout = simulate(&first_dir);
    assert!(stdout.contains("trace: 600 tasks"), "{stdout}");
    assert!(
        stdout.contains("variant A: aging=builtin:aging-threshold"),
        "{stdout}"
    );
    assert!(
        stdout.contains("variant B: aging=builtin:aging-deadline"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: B "), "{stdout}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(first_dir.join("report.json")).unwrap()).unwrap();
    let variants = report["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2);
    for variant in variants {
        assert_eq!(variant["tasks"], 600);
        assert_eq!(variant["completed"], 600, "{variant}");
        assert_eq!(variant["wait_ms"]["urgent"]["claimed"], 100);
        assert_eq!(variant["wait_ms"]["low"]["claimed"], 300);
        assert!(variant["promotions"].as_u64().unwrap() > 0, "{variant}");
    }
    assert_ne!(variants[0]["wait_ms"], variants[1]["wait_ms"]);
    for plot in ["wait-cdf.svg", "queue-depth.svg"] {
        let svg = std::fs::read_to_string(first_dir.join(plot)).unwrap();
        assert!(svg.contains("<polyline"), "{plot}");
    }
    let second_dir = dir.path().join("second");
    assert_eq!(stdout, simulate(&second_dir), "same seed, same stdout");
    assert_eq!(
        std::fs::read(first_dir.join("report.json")).unwrap(),
        std::fs::read(second_dir.join("report.json")).unwrap(),
        "same seed, same report.json"
    );
    // Bad input: a clear message and a non-zero exit.
    for (args, says) in [
        (vec!["--workers", "2y2"], "COUNTxGPUS"),
        (vec!["--policy", "aging=builtin:nope"], "no built-in policy"),
        (
            vec!["--compare", "aging=builtin:retry-backoff"],
            "cannot be loaded",
        ),
    ] {
        let mut all = vec!["sim", "--trace", trace.to_str().unwrap()];
        all.extend(args);
        let refused = run_sluice(&all, &[]);
        assert!(!refused.status.success());
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// A trace exported from a real server holds what it ran — submissions, service times, failed
/// attempts — and replays in the simulator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_export_writes_what_a_server_ran_and_it_replays() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let client = http();
    let heartbeat = json!({"gpus": [], "max_concurrency": 4});
    let beat_url = server.endpoint("/v1/workers/w/heartbeat");
    assert_eq!(post_json(&client, &beat_url, &heartbeat).await.status, 200);
    for priority in ["urgent", "low", "normal"] {
        let body = json!({"kind": "oct.scan", "priority": priority, "tenant": "site-3", "est_exec_ms": 700});
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    let claim_url = server.endpoint("/v1/workers/w/claim");
    let claim = post_json(&client, &claim_url, &json!({"max": 3, "wait_ms": 2000})).await;
    let leases = claim.body["leases"].as_array().unwrap().clone();
    assert_eq!(leases.len(), 3);
    for lease in &leases {
        let id = lease["task"]["id"].as_str().unwrap();
        let token = &lease["lease_token"];
        let (report, body) = if lease["task"]["priority"] == "low" {
            (
                "fail",
                json!({"lease_token": token, "class": "permanent", "message": "bad scan"}),
            )
        } else {
            ("complete", json!({"lease_token": token, "result": {}}))
        };
        let url = server.endpoint(&format!("/v1/tasks/{id}/{report}"));
        assert_eq!(post_json(&client, &url, &body).await.status, 200);
    }
    let out = dir.path().join("exported.jsonl");
    let server_arg = format!("--server={}", server.url);
    let stderr = run_sluice(
        &[
            "trace",
            "export",
            &server_arg,
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert!(stderr.status.success(), "{stderr:?}");
    let said = String::from_utf8_lossy(&stderr.stderr);
    assert!(said.contains("exported 3 tasks"), "{said}");
    let tasks: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let priorities: Vec<&str> = tasks
        .iter()
        .map(|t| t["priority"].as_str().unwrap())
        .collect();
    assert_eq!(
        priorities,
        ["urgent", "low", "normal"],
        "in submission order"
    );
    assert_eq!(tasks[0]["submit_ms"], 0);
    assert!(
        tasks
            .iter()
            .all(|t| t["tenant"] == "site-3" && t["est_exec_ms"] == 700)
    );
    assert_eq!(tasks[1]["failures"], json!(["permanent"]));
    assert!(tasks[0].get("failures").is_none());
    // And it replays: the permanent failure is dead again, the others complete.
    let stdout = succeeded(run_sluice(
        &["sim", "--trace", out.to_str().unwrap(), "--workers", "1x1"],
        &[],
    ));
    assert!(stdout.contains("completed 2, dead 1"), "{stdout}");
}
