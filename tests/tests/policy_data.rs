//! Policy data end to end: split-ivf uploaded with 1,024 centroids of 384 dimensions as a data
//! blob (a 1.5 MiB .npy, far past what a config may carry), activated, and asked real vector
//! searches through a real IVF worker; every answer must be exactly the nearest hits among the
//! vectors its probes reach, computed here apart from Sluice. A version's data is refused once
//! it has been activated, and bad names and sizes are refused.

use sluice_tests::*;
use std::time::Duration;

const DIM: usize = 384;
const ROWS: usize = 2048;
const LISTS: usize = 1024;
const NPROBE: usize = 8;
const K: usize = 10;

/// Uniform values in [-1, 1) from a fixed linear congruential sequence.
fn values(seed: u64, count: usize) -> Vec<f32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn distance(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum()
}

/// The `n` nearest centroids of `vector`, nearest first, ties to the lower list.
fn nearest_lists(centroids: &[f32], vector: &[f32], n: usize) -> Vec<usize> {
    let mut ranked: Vec<(f32, usize)> = centroids
        .chunks_exact(DIM)
        .enumerate()
        .map(|(list, c)| (distance(c, vector), list))
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    ranked.into_iter().take(n).map(|(_, list)| list).collect()
}

/// The ids of the `K` nearest rows among those whose list is one of `probed`.
fn reachable_top_k(
    data: &[f32],
    lists_of_rows: &[usize],
    probed: &[usize],
    query: &[f32],
) -> Vec<u64> {
    let mut hits: Vec<(f32, u64)> = data
        .chunks_exact(DIM)
        .enumerate()
        .filter(|(row, _)| probed.contains(&lists_of_rows[*row]))
        .map(|(row, v)| (distance(query, v), row as u64))
        .collect();
    hits.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    hits.into_iter().take(K).map(|(_, id)| id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_ivf_with_a_centroid_blob_answers_what_its_probes_reach() {
    let dir = tempfile::tempdir().unwrap();
    let data = values(0x2545_f491_4f6c_dd1d, ROWS * DIM);
    let centroids = values(0x9e37_79b9_7f4a_7c15, LISTS * DIM);
    let vectors_file = dir.path().join("vectors.npy");
    let centroids_file = dir.path().join("centroids.npy");
    write_npy(&vectors_file, DIM, &data);
    write_npy(&centroids_file, DIM, &centroids);
    assert!(std::fs::metadata(&centroids_file).unwrap().len() > 1_500_000);
    let lists_of_rows: Vec<usize> = data
        .chunks_exact(DIM)
        .map(|row| nearest_lists(&centroids, row, 1)[0])
        .collect();

    let blob = format!("centroids={}", centroids_file.display());
    // Offline first: `policy check --data` runs the checks an upload of the blob runs.
    let component = dir.path().join("split_ivf.wasm");
    std::fs::write(&component, policy_component("split-ivf", None)).unwrap();
    let component = component.to_str().unwrap();
    let checked = succeeded(run_sluice(
        &[
            "policy", "check", component, "--data", &blob, "--config", "nprobe=8",
        ],
        &[],
    ));
    assert!(checked.contains("is a split policy"), "{checked}");
    let odd = dir.path().join("odd.bin");
    std::fs::write(&odd, [0u8; 7]).unwrap();
    let odd = format!("centroids={}", odd.display());
    let refused = run_sluice(&["policy", "check", component, "--data", &odd], &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("with the data centroids"), "{stderr}");

    let server = Server::start(&dir.path().join("db"));
    let uploaded = succeeded(run_sluice(
        &[
            "policy",
            "upload",
            "--server",
            &server.url,
            "split",
            "--builtin",
            "split-ivf",
            "--data",
            &blob,
            "--config",
            "nprobe=8",
        ],
        &[],
    ));
    let uploaded: Value = serde_json::from_str(&uploaded).unwrap();
    let version = uploaded["version"].as_u64().unwrap();
    assert_eq!(uploaded["data"][0]["name"], "centroids");
    assert_eq!(
        uploaded["data"][0]["size_bytes"],
        std::fs::metadata(&centroids_file).unwrap().len()
    );
    succeeded(run_sluice(
        &[
            "policy",
            "activate",
            "--server",
            &server.url,
            "split",
            &version.to_string(),
        ],
        &[],
    ));
    let client = http();
    let detail = get_json(&client, &server.endpoint("/v1/policies/split")).await;
    let stored = detail.body["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["version"] == version)
        .cloned()
        .unwrap();
    assert_eq!(stored["data"][0]["sha256"].as_str().unwrap().len(), 64);

    // What it reads cannot change once it is active; names and sizes are checked.
    let put = |path: String, bytes: Vec<u8>| {
        let (client, url) = (client.clone(), server.endpoint(&path));
        async move { put_octets(&client, &url, bytes).await }
    };
    let late = put(
        format!("/v1/policies/split/{version}/data/centroids"),
        vec![0; 16],
    )
    .await;
    assert_problem(&late, 409, "policy-conflict");
    let unknown = put("/v1/policies/split/999/data/centroids".into(), vec![0; 16]).await;
    assert_problem(&unknown, 404, "policy-version-not-found");

    let _worker = Worker::start(
        &server,
        "ivf-0",
        &[
            "--vectors",
            vectors_file.to_str().unwrap(),
            "--centroids",
            centroids_file.to_str().unwrap(),
            "--gpus",
            "0",
            "--max-concurrency",
            "4",
        ],
    );
    live_shards(&client, &server, "default", 1).await;
    for row in [3, 500, 1234, 2047] {
        let query: Vec<f32> = data[row * DIM..(row + 1) * DIM]
            .iter()
            .map(|x| x + 0.01)
            .collect();
        let submitted = post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "vector.search", "payload": {"vector": query, "k": K}}),
        )
        .await;
        assert_eq!(submitted.status, 201, "{:?}", submitted.body);
        let id = submitted.body["id"].as_str().unwrap().to_owned();
        let url = server.endpoint(&format!("/v1/tasks/{id}"));
        let parent = wait_for("the search to end", Duration::from_secs(120), || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let task = get_json(&client, &url).await.body;
                matches!(
                    task["state"].as_str(),
                    Some("completed" | "failed" | "dead")
                )
                .then_some(task)
            }
        })
        .await;
        assert_eq!(parent["state"], "completed", "{parent:?}");
        assert_eq!(parent["result"]["children"], NPROBE as u64);
        let probed = nearest_lists(&centroids, &query, NPROBE);
        let expected = reachable_top_k(&data, &lists_of_rows, &probed, &query);
        let got: Vec<u64> = parent["result"]["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["id"].as_u64().unwrap())
            .collect();
        assert_eq!(got, expected, "query near row {row}");
        assert!(got.contains(&(row as u64)), "the row itself is reachable");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_names_sizes_and_conformance_are_checked_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "max_policy_data_bytes = 4096\n").unwrap();
    let server = Server::start_with(
        &dir.path().join("db"),
        &["--config", config.to_str().unwrap()],
    );
    let uploaded = succeeded(run_sluice(
        &[
            "policy",
            "upload",
            "--server",
            &server.url,
            "split",
            "--builtin",
            "split-ivf",
        ],
        &[],
    ));
    let version = serde_json::from_str::<Value>(&uploaded).unwrap()["version"]
        .as_u64()
        .unwrap();
    let client = http();
    let put = |name: &str, bytes: Vec<u8>| {
        let (client, url) = (
            client.clone(),
            server.endpoint(&format!("/v1/policies/split/{version}/data/{name}")),
        );
        async move { put_octets(&client, &url, bytes).await }
    };
    let bad_name = put("no%20spaces", vec![0; 8]).await;
    assert_problem(&bad_name, 422, "policy-refused");
    assert_eq!(bad_name.body["check"], "data");
    let too_big = put("centroids", vec![0; 8192]).await;
    assert_problem(&too_big, 413, "body-too-large");
    // Raw f32 centroids without `dim`: split-ivf's init refuses them, so nothing is kept.
    let refused = put("centroids", vec![0; 64]).await;
    assert_problem(&refused, 422, "policy-refused");
    assert_eq!(refused.body["check"], "init", "{:?}", refused.body);
    let detail = get_json(&client, &server.endpoint("/v1/policies/split")).await;
    let stored = detail.body["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["version"] == version)
        .cloned()
        .unwrap();
    assert!(stored.get("data").is_none(), "{stored:?}");
}
