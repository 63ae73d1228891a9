//! Split and merge end to end: `vector.search` tasks through a real server, real shard worker
//! processes over a .npy file, and the real policy components; every answer is checked
//! against a brute-force search written here, apart from Sluice's own.

use sluice_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const DIM: usize = 8;
const ROWS: usize = 600;
const K: usize = 10;
const WAIT: Duration = Duration::from_secs(60);

/// Clustered rows from a fixed linear congruential sequence: the same set every run.
fn dataset() -> Vec<f32> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let centres: Vec<f32> = (0..6 * DIM).map(|_| next() * 8.0).collect();
    let mut data = Vec::with_capacity(ROWS * DIM);
    for row in 0..ROWS {
        for d in 0..DIM {
            data.push(centres[(row % 6) * DIM + d] + next());
        }
    }
    data
}

/// (id, squared L2 distance) of the `k` nearest rows, by distance then id.
fn exact(data: &[f32], query: &[f32], k: usize) -> Vec<(u64, f32)> {
    exact_of(data, DIM, query, k)
}

/// `exact` over rows of `dim` numbers.
fn exact_of(data: &[f32], dim: usize, query: &[f32], k: usize) -> Vec<(u64, f32)> {
    let mut all: Vec<(u64, f32)> = data
        .chunks_exact(dim)
        .enumerate()
        .map(|(row, v)| {
            let d: f32 = query.iter().zip(v).map(|(a, b)| (a - b) * (a - b)).sum();
            (row as u64, d)
        })
        .collect();
    all.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    all.truncate(k);
    all
}

fn query_vector(data: &[f32], row: usize) -> Vec<f32> {
    data[row * DIM..(row + 1) * DIM]
        .iter()
        .map(|x| x + 0.05)
        .collect()
}

async fn submit(client: &reqwest::Client, server: &Server, payload: Value) -> String {
    let answer = post_json(
        client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "vector.search", "max_attempts": 1, "payload": payload}),
    )
    .await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    assert_eq!(answer.body["state"], "split", "{:?}", answer.body);
    answer.body["id"].as_str().unwrap().to_owned()
}

async fn task(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    get_json(client, &server.endpoint(&format!("/v1/tasks/{id}")))
        .await
        .body
}

async fn ended(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    wait_for(&format!("task {id} to end"), WAIT, || async {
        let task = task(client, server, id).await;
        let state = task["state"].as_str().unwrap_or("").to_owned();
        ["completed", "failed", "dead", "cancelled", "timed_out"]
            .contains(&state.as_str())
            .then_some(task)
    })
    .await
}

fn hit_ids(result: &Value) -> Vec<u64> {
    result["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_u64().unwrap())
        .collect()
}

fn cli(server: &Server, args: &[&str]) -> Value {
    let out = Command::new(sluice_binary())
        .args(args)
        .args(["--server", &server.url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluice {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Submits a search with `payload` that must be refused (422 `problem`); the detail.
async fn refused(
    client: &reqwest::Client,
    server: &Server,
    payload: Value,
    problem: &str,
) -> String {
    let answer = post_json(
        client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "vector.search", "payload": payload}),
    )
    .await;
    assert_problem(&answer, 422, problem);
    answer.body["detail"].as_str().unwrap().to_owned()
}

/// Uploads merge-threshold with `max_distance` at `threshold`; its version.
fn upload_threshold(server: &Server, threshold: f32) -> u64 {
    let config = format!("max_distance={threshold}");
    let uploaded = cli(
        server,
        &[
            "policy",
            "upload",
            "merge",
            "--builtin",
            "merge-threshold",
            "--config",
            &config,
        ],
    );
    uploaded["version"].as_u64().unwrap()
}

/// A temporary folder holding the data set as .npy, and a server started with `args`.
fn start(
    store: &TestStore,
    args: &[&str],
) -> (tempfile::TempDir, Vec<f32>, std::path::PathBuf, Server) {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset();
    let file = dir.path().join("vectors.npy");
    write_npy(&file, DIM, &data);
    let server = store.start_with(&dir.path().join("db"), args);
    (dir, data, file, server)
}

/// A worker holding stored shard `index` of `count`.
fn shard_worker(
    server: &Server,
    file: &Path,
    index: usize,
    count: usize,
    extra: &[&str],
) -> Worker {
    let shard = format!("{index}/{count}");
    let mut args = vec![
        "--vectors",
        file.to_str().unwrap(),
        "--shard",
        &shard,
        "--gpus",
        "0",
        "--max-concurrency",
        "4",
    ];
    args.extend_from_slice(extra);
    Worker::start(server, &format!("shard-{index}"), &args)
}

on_each_store!(split_queries_equal_exact_search_and_a_merge_policy_swap_applies_to_the_next_query);

async fn split_queries_equal_exact_search_and_a_merge_policy_swap_applies_to_the_next_query(
    store: TestStore,
) {
    let (_dir, data, file, server) = start(&store, &["--policy-config", "split.shards=3"]);
    let _workers: Vec<Worker> = (0..3)
        .map(|i| shard_worker(&server, &file, i, 3, &[]))
        .collect();
    let client = http();
    live_shards(&client, &server, "default", 3).await;

    for row in [0, 77, 301, 599] {
        let query = query_vector(&data, row);
        let id = submit(&client, &server, json!({"vector": query, "k": K})).await;
        let parent = ended(&client, &server, &id).await;
        assert_eq!(parent["state"], "completed", "{parent:?}");
        let result = &parent["result"];
        let expected: Vec<u64> = exact(&data, &query, K).iter().map(|h| h.0).collect();
        assert_eq!(hit_ids(result), expected, "query near row {row}");
        assert_eq!(result["coverage"], 1.0);
        assert_eq!(result["partial"], false);
        assert_eq!(result["children"], 3);
        assert_eq!(result["merge_policy_version"], 0);
        for part in parent["family"]["parts"].as_array().unwrap() {
            let child = task(&client, &server, part["task"].as_str().unwrap()).await;
            assert_eq!(child["state"], "completed");
            assert_eq!(child["parent"], parent["id"]);
        }
    }

    // The threshold merge, with a threshold between the 3rd and 4th nearest of the next query.
    let query = query_vector(&data, 123);
    let nearest = exact(&data, &query, K);
    let threshold = (nearest[2].1 + nearest[3].1) / 2.0;
    let version = upload_threshold(&server, threshold);
    cli(
        &server,
        &["policy", "activate", "merge", &version.to_string()],
    );
    let id = submit(&client, &server, json!({"vector": query, "k": K})).await;
    let parent = ended(&client, &server, &id).await;
    let within: Vec<u64> = nearest
        .iter()
        .filter(|h| h.1 <= threshold)
        .map(|h| h.0)
        .collect();
    assert_eq!(within.len(), 3);
    assert_eq!(hit_ids(&parent["result"]), within);
    assert_eq!(parent["result"]["merge_policy_version"], version);

    // And back to the built-in top-k, again without a restart.
    cli(&server, &["policy", "activate", "merge", "0"]);
    let id = submit(&client, &server, json!({"vector": query, "k": K})).await;
    let parent = ended(&client, &server, &id).await;
    assert_eq!(hit_ids(&parent["result"]).len(), K);
    assert_eq!(parent["result"]["merge_policy_version"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_worker_killed_mid_query_gives_a_partial_answer_or_a_failure_naming_the_shard() {
    let (_dir, data, file, server) = start(
        &TestStore::Sled,
        &["--lease-ms", "1000", "--policy-config", "split.shards=2"],
    );
    let _shard0 = shard_worker(&server, &file, 0, 2, &[]);
    // Shard 1's worker holds its children until it is killed.
    let shard1 = shard_worker(&server, &file, 1, 2, &["--exec-ms", "600000"]);
    let client = http();
    live_shards(&client, &server, "default", 2).await;
    let query = query_vector(&data, 10);
    let allowed = submit(&client, &server, json!({"vector": query, "k": K})).await;
    let strict = submit(
        &client,
        &server,
        json!({"vector": query, "k": K, "allow_partial": false}),
    )
    .await;
    for parent in [&allowed, &strict] {
        let parent = task(&client, &server, parent).await;
        let child = parent["family"]["parts"][1]["task"]
            .as_str()
            .unwrap()
            .to_owned();
        wait_for("shard 1's child to be held", WAIT, || async {
            let state = task(&client, &server, &child).await["state"].clone();
            (state == "claimed" || state == "running").then_some(())
        })
        .await;
    }
    shard1.kill9();

    let partial = ended(&client, &server, &allowed).await;
    assert_eq!(partial["state"], "completed", "{partial:?}");
    let result = &partial["result"];
    assert_eq!(result["partial"], true);
    assert_eq!(result["coverage"], 0.5);
    let missing = result["missing"][0].as_str().unwrap();
    assert!(missing.starts_with("shard 1"), "{missing}");
    // What shard 0 holds, exactly: rows 0..300.
    let shard0: Vec<f32> = data[..ROWS / 2 * DIM].to_vec();
    let expected: Vec<u64> = exact(&shard0, &query, K).iter().map(|h| h.0).collect();
    assert_eq!(hit_ids(result), expected);

    let failed = ended(&client, &server, &strict).await;
    assert_eq!(failed["state"], "failed", "{failed:?}");
    assert_eq!(failed["error"]["class"], "partial");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(message.contains("shard 1"), "{message}");
}

on_each_store!(
    bad_queries_and_refused_splits_create_nothing_and_a_cancelled_parent_cancels_its_children
);

async fn bad_queries_and_refused_splits_create_nothing_and_a_cancelled_parent_cancels_its_children(
    store: TestStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start_with(dir.path(), &["--policy-config", "split.shards=2"]);
    let client = http();
    // No worker holds the default collection and none was declared: nothing to search.
    let detail = refused(
        &client,
        &server,
        json!({"vector": [1.0, 2.0]}),
        "split-refused",
    )
    .await;
    assert!(
        detail.contains("collection `default` is unknown"),
        "{detail}"
    );
    // Declared by an administrator (kept in the catalog): two shards of two dimensions.
    let declare = |name: &str, body: Value| {
        let url = server.endpoint(&format!("/v1/collections/{name}"));
        let client = client.clone();
        async move {
            let response = client.put(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    };
    let (status, body) = declare("default", json!({"dim": 2, "shards": 2})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["metric"], "l2");
    for bad in [
        json!({"dim": 0, "shards": 2}),
        json!({"dim": 2, "shards": 5000}),
        json!({"dim": 2}),
        json!({"dim": 2, "shards": 2, "colour": "red"}),
    ] {
        let (status, body) = declare("default", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(
            body["type"], "urn:sluice:problem:invalid-request",
            "{bad}: {body}"
        );
    }
    let (status, _) = declare("a%20b", json!({"dim": 2, "shards": 2})).await;
    assert_eq!(status, 400);
    let view = get_json(&client, &server.endpoint("/v1/collections/default")).await;
    assert_eq!(view.body["declared"], true, "{:?}", view.body);
    assert_eq!(view.body["shards"], 2);
    assert_eq!(view.body["live_shards"], 0);
    let missing = get_json(&client, &server.endpoint("/v1/collections/nothing")).await;
    assert_problem(&missing, 404, "collection-not-found");
    for (payload, field) in [
        (
            json!({"vector": [1.0, 2.0, 3.0]}),
            "has 3 numbers; collection `default` has 2",
        ),
        (
            json!({"vector": [1.0, 2.0], "metric": "ip"}),
            "searched by l2, not ip",
        ),
    ] {
        let detail = refused(&client, &server, payload, "invalid-task").await;
        assert!(detail.contains(field), "{detail}");
    }
    for payload in [
        json!({"vector": []}),
        json!({"vector": [1.0], "k": 0}),
        json!({"vector": [1.0], "metric": "cosine"}),
        json!({"k": 3}),
    ] {
        refused(&client, &server, payload, "invalid-task").await;
    }

    let id = submit(&client, &server, json!({"vector": [1.0, 2.0]})).await;
    let answer = post_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{id}/cancel")),
        &json!({}),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let parent = task(&client, &server, &id).await;
    assert_eq!(parent["state"], "cancelled");
    for part in parent["family"]["parts"].as_array().unwrap() {
        let child = task(&client, &server, part["task"].as_str().unwrap()).await;
        assert_eq!(child["state"], "cancelled", "{child:?}");
    }

    // A split policy that would make more children than its bound refuses every query.
    let uploaded = cli(
        &server,
        &[
            "policy",
            "upload",
            "split",
            "--builtin",
            "split-shards",
            "--config",
            "shards=300",
        ],
    );
    let version = uploaded["version"].as_u64().unwrap().to_string();
    cli(&server, &["policy", "activate", "split", &version]);
    let before = count_in(&client, &server, "cancelled").await;
    let detail = refused(
        &client,
        &server,
        json!({"vector": [1.0, 2.0]}),
        "split-refused",
    )
    .await;
    assert!(detail.contains("limit of 256"), "{detail}");
    let stats = get_json(&client, &server.endpoint("/v1/stats")).await.body;
    let total: u64 = stats["tasks_by_state"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        total, 3,
        "only the cancelled parent and its two children: {stats}"
    );
    assert_eq!(before, 3);
}

/// The UCI handwritten digits (1,797 × 64, from smartcore): real vectors, with the many equal
/// distances of integer pixels, which the merge must break by id as brute force does.
fn digits() -> (usize, Vec<f32>) {
    let set = smartcore::dataset::digits::load_dataset();
    assert_eq!((set.num_samples, set.num_features), (1797, 64));
    (set.num_features, set.data)
}

/// The acceptance of issue 47's first item: four shard workers started as the docs say (the
/// last one after the others) over a real set, no split configuration, and every search
/// answers from all four shards; a killed worker's shard is named missing, with coverage
/// measured by data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_shard_workers_with_no_split_setting_are_all_searched_and_a_dead_one_is_named() {
    let (dim, data) = digits();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("digits.npy");
    write_npy(&file, dim, &data);
    let server = TestStore::Sled.start_with(&dir.path().join("db"), &["--worker-stale-ms", "3000"]);
    let client = http();
    let mut workers: Vec<Worker> = (0..3)
        .map(|i| shard_worker(&server, &file, i, 4, &[]))
        .collect();
    let three = live_shards(&client, &server, "default", 3).await;
    assert_eq!(
        (&three["shards"], &three["dim"]),
        (&json!(4), &json!(64)),
        "{three}"
    );
    assert_eq!(three["declared"], false);
    workers.push(shard_worker(&server, &file, 3, 4, &[]));
    live_shards(&client, &server, "default", 4).await;
    // Shard I holds rows [I·1797/4, (I+1)·1797/4): 0, 449, 898, 1347, 1797.
    let query_near = |row: usize| -> Vec<f32> {
        data[row * dim..(row + 1) * dim]
            .iter()
            .map(|x| x + 0.25)
            .collect()
    };

    let mut recalled = 0;
    let rows = [0, 41, 448, 449, 897, 898, 1346, 1347, 1700, 1796];
    for row in rows {
        let query = query_near(row);
        let id = submit(&client, &server, json!({"vector": query, "k": K})).await;
        let parent = ended(&client, &server, &id).await;
        let result = &parent["result"];
        assert_eq!(parent["state"], "completed", "{parent:?}");
        assert_eq!(result["children"], 4, "{result}");
        assert_eq!(result["coverage"], 1.0);
        assert_eq!(result["partial"], false);
        assert_eq!(
            (&result["collection"], &result["metric"]),
            (&json!("default"), &json!("l2"))
        );
        let expected: Vec<u64> = exact_of(&data, dim, &query, K)
            .iter()
            .map(|h| h.0)
            .collect();
        let got = hit_ids(result);
        recalled += got.iter().filter(|id| expected.contains(id)).count();
        assert_eq!(got, expected, "query near row {row}");
    }
    assert_eq!(recalled, rows.len() * K, "recall@{K} = 1.0");

    // A worker that disagrees with the collection's shape is refused, and says why.
    let wrong = Command::new(sluice_binary())
        .args([
            "worker",
            "--server",
            &server.url,
            "--id",
            "wrong",
            "--gpus",
            "0",
        ])
        .args(["--vectors", file.to_str().unwrap(), "--shard", "5/8"])
        .env("SLUICE_LOG", "error")
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    let said = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        said.contains("shard 5/8") && said.contains("has 4 shards"),
        "{said}"
    );

    // Shard 2's worker dies: once its heartbeat is stale, searches leave shard 2 out and say so.
    workers.remove(2).kill9();
    live_shards(&client, &server, "default", 3).await;
    let query = query_near(1000);
    let id = submit(&client, &server, json!({"vector": query, "k": K})).await;
    let partial = ended(&client, &server, &id).await;
    assert_eq!(partial["state"], "completed", "{partial:?}");
    let result = &partial["result"];
    assert_eq!(result["partial"], true, "{result}");
    assert_eq!(result["coverage"], 0.75);
    assert_eq!(result["children"], 3);
    let missing = result["missing"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{missing:?}");
    assert!(
        missing[0].as_str().unwrap().starts_with("shard 2 ("),
        "{missing:?}"
    );
    // Exactly what shards 0, 1 and 3 hold: every row but 898..1347.
    let kept: Vec<f32> = data
        .chunks_exact(dim)
        .enumerate()
        .filter(|(row, _)| !(898..1347).contains(row))
        .flat_map(|(_, v)| v.iter().copied())
        .collect();
    let renumber = |i: u64| if i >= 898 { i + 449 } else { i };
    let expected: Vec<u64> = exact_of(&kept, dim, &query, K)
        .iter()
        .map(|h| renumber(h.0))
        .collect();
    assert_eq!(hit_ids(result), expected);

    let strict = submit(
        &client,
        &server,
        json!({"vector": query, "k": K, "allow_partial": false}),
    )
    .await;
    let failed = ended(&client, &server, &strict).await;
    assert_eq!(failed["state"], "failed", "{failed:?}");
    assert_eq!(failed["error"]["class"], "partial");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("1 of 4 shards") && message.contains("shard 2"),
        "{message}"
    );
}

/// Submits a search for each of `queries` at once, then waits for every one to end.
async fn search_all(client: &reqwest::Client, server: &Server, queries: &[Vec<f32>]) -> Vec<Value> {
    let mut ids = Vec::with_capacity(queries.len());
    for query in queries {
        ids.push(submit(client, server, json!({"vector": query, "k": K})).await);
    }
    let mut ended_tasks = Vec::with_capacity(ids.len());
    for id in &ids {
        ended_tasks.push(ended(client, server, id).await);
    }
    ended_tasks
}

fn merge_figures(report: &Value, variant: usize) -> &Value {
    &report["variants"][variant]["runtime"]["merge"]
}

/// The acceptance of issue 47's third item: merge-topk against merge-threshold (its bound cuts
/// answers about in half), live over 200 searches and then in shadow over the same 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_experiments_live_and_in_shadow_are_judged_by_recall_on_the_same_searches() {
    let (dir, data, file, server) = start(&TestStore::Sled, &[]);
    let client = http();
    let _workers: Vec<Worker> = (0..4)
        .map(|i| shard_worker(&server, &file, i, 4, &[]))
        .collect();
    live_shards(&client, &server, "default", 4).await;
    let queries: Vec<Vec<f32>> = (0..200)
        .map(|i| query_vector(&data, i * 3 % ROWS))
        .collect();
    let exacts: Vec<Vec<(u64, f32)>> = queries.iter().map(|q| exact(&data, q, K)).collect();
    let mut fifth: Vec<f32> = exacts.iter().map(|e| e[4].1).collect();
    fifth.sort_by(f32::total_cmp);
    let threshold = fifth[fifth.len() / 2];
    let version = upload_threshold(&server, threshold);
    let variants =
        json!([{"name": "topk", "version": 0}, {"name": "threshold", "version": version}]);
    let experiments = server.endpoint("/v1/experiments");

    // Live: each search is answered by its own variant's merge.
    let started = post_json(
        &client,
        &experiments,
        &json!({"kind": "merge", "variants": variants}),
    )
    .await;
    assert_eq!(started.status, 201, "{:?}", started.body);
    let live_id = started.body["id"].as_u64().unwrap();
    let answered = search_all(&client, &server, &queries).await;
    let mut by_variant = [0; 2];
    for (parent, exact) in answered.iter().zip(&exacts) {
        assert_eq!(parent["state"], "completed", "{parent:?}");
        let tag = parent["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["kind"] == "merge")
            .unwrap();
        let variant = tag["variant"].as_u64().unwrap() as usize;
        by_variant[variant] += 1;
        let expected: Vec<u64> = exact
            .iter()
            .filter(|h| variant == 0 || h.1 <= threshold)
            .map(|h| h.0)
            .collect();
        assert_eq!(hit_ids(&parent["result"]), expected, "variant {variant}");
    }
    assert!(by_variant.iter().all(|&n| n > 50), "{by_variant:?}");
    let live = get_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{live_id}")),
    )
    .await
    .body;
    println!("{}", live["text"].as_str().unwrap());
    let (topk, cut) = (merge_figures(&live, 0), merge_figures(&live, 1));
    assert_eq!(
        topk["searches"], 200,
        "every variant merges every search: {live}"
    );
    assert_eq!(cut["searches"], 200);
    assert_eq!(topk["recall_at_k"]["mean"], 1.0);
    assert_eq!(topk["recall_at_k"]["interval"], json!([1.0, 1.0]));
    let recall = cut["recall_at_k"]["mean"].as_f64().unwrap();
    let high = cut["recall_at_k"]["interval"][1].as_f64().unwrap();
    assert!(
        recall < 0.8 && high < 0.9,
        "the threshold cuts answers: {cut}"
    );
    assert!(cut["overlap_at_k"]["mean"].as_f64().unwrap() < 0.9, "{cut}");
    assert!(
        cut["merge_us_p50"].is_u64() && cut["merge_us_p99"].is_u64(),
        "{cut}"
    );
    let verdict = live["comparisons"][0]["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("threshold lowers recall@k"),
        "{verdict}"
    );
    let searches: u64 = (0..2)
        .map(|v| live["variants"][v]["searches"].as_u64().unwrap())
        .sum();
    assert_eq!(searches, 200);
    let tasks: u64 = (0..2)
        .map(|v| live["variants"][v]["tasks"].as_u64().unwrap())
        .sum();
    assert_eq!(
        tasks, 200,
        "a merge experiment counts searches, not their children"
    );

    // The same 200 searches offline: exported with their children's hits, merged again by the
    // same two components, the same figures.
    let trace = dir.path().join("searches.jsonl");
    let exported = Command::new(sluice_binary())
        .args([
            "trace",
            "export",
            "--with-hits",
            "--server",
            &server.url,
            "--out",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        exported.status.success(),
        "{}",
        String::from_utf8_lossy(&exported.stderr)
    );
    let threshold_choice = format!("threshold=builtin:merge-threshold?max_distance={threshold}");
    let offline = Command::new(sluice_binary())
        .args(["sim", "--trace"])
        .arg(&trace)
        .args([
            "--merge",
            "topk=builtin:merge-topk",
            "--merge",
            &threshold_choice,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        offline.status.success(),
        "{}",
        String::from_utf8_lossy(&offline.stderr)
    );
    let offline: Value = serde_json::from_slice(&offline.stdout).unwrap();
    for (name, variant) in [("topk", 0), ("threshold", 1)] {
        let live = merge_figures(&live, variant);
        assert_eq!(offline[name]["searches"], 200, "{offline}");
        assert_eq!(offline[name]["recall_at_k"], live["recall_at_k"], "{name}");
        assert_eq!(
            offline[name]["overlap_at_k"], live["overlap_at_k"],
            "{name}"
        );
        assert_eq!(offline[name]["verdict"], live["verdict"], "{name}");
    }
    let promoted = post_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{live_id}/promote")),
        &json!({"variant": "threshold"}),
    )
    .await;
    assert_eq!(promoted.status, 200, "{:?}", promoted.body);
    let merge = get_json(&client, &server.endpoint("/v1/policies/merge"))
        .await
        .body;
    assert_eq!(merge["active_version"], version);

    // Shadow, with top-k active again: every answer is top-k's, and the recall figures of the
    // same 200 searches are the live run's.
    cli(&server, &["policy", "activate", "merge", "0"]);
    let started = post_json(
        &client,
        &experiments,
        &json!({"kind": "merge", "variants": variants, "mode": "shadow"}),
    )
    .await;
    assert_eq!(started.status, 201, "{:?}", started.body);
    let shadow_id = started.body["id"].as_u64().unwrap();
    let answered = search_all(&client, &server, &queries).await;
    for (parent, exact) in answered.iter().zip(&exacts) {
        let expected: Vec<u64> = exact.iter().map(|h| h.0).collect();
        assert_eq!(hit_ids(&parent["result"]), expected);
    }
    let shadow = get_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{shadow_id}")),
    )
    .await
    .body;
    for variant in 0..2 {
        let (live, shadow) = (
            merge_figures(&live, variant),
            merge_figures(&shadow, variant),
        );
        assert_eq!(shadow["searches"], 200);
        assert_eq!(
            shadow["recall_at_k"], live["recall_at_k"],
            "variant {variant}"
        );
        assert_eq!(
            shadow["overlap_at_k"], live["overlap_at_k"],
            "variant {variant}"
        );
    }
    assert_eq!(
        shadow["comparisons"][0]["verdict"],
        live["comparisons"][0]["verdict"]
    );
}
