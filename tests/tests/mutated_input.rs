//! Seeded random mutations of valid submissions: every answer is a success or a 4xx
//! problem+json, never a 5xx, a hang or a dropped connection, and the server stays healthy.

use sluice_tests::*;

/// A small deterministic generator (SplitMix64), so a failure replays from its seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const SEED: u64 = 0x5eed_0001;
const CASES: usize = 1500;

fn valid(random: &mut Random) -> String {
    json!({"kind": "oct.analyze", "key": format!("m-{}", random.next() % 50), "priority": "low",
           "labels": {"site": "a"}, "max_attempts": 3, "deadline_ms": 60000,
           "resources": {"gpu_memory_mb": 100}, "payload": {"eye": "left", "n": [1, 2, 3]}})
    .to_string()
}

fn mutate(random: &mut Random, body: String) -> Vec<u8> {
    let mut bytes = body.into_bytes();
    match random.below(8) {
        0 => bytes.truncate(random.below(bytes.len() + 1)),
        1 => {
            for _ in 0..1 + random.below(4) {
                let at = random.below(bytes.len());
                bytes[at] = random.next() as u8;
            }
        }
        2 => {
            let at = random.below(bytes.len());
            let junk: Vec<u8> = (0..random.below(16)).map(|_| random.next() as u8).collect();
            bytes.splice(at..at, junk);
        }
        3 => {
            let swaps = [
                ("\"low\"", "7"),
                ("3", "\"3\""),
                ("100", "-100"),
                ("{\"eye\"", "[\"eye\""),
                ("60000", "1e400"),
                ("\"a\"", "null"),
                ("\"oct.analyze\"", "\"\""),
            ];
            let (from, to) = swaps[random.below(swaps.len())];
            bytes = String::from_utf8_lossy(&bytes)
                .replacen(from, to, 1)
                .into_bytes();
        }
        4 => bytes = vec![b'['; 1 + random.below(4096)],
        5 => {
            bytes = (0..random.below(256))
                .map(|_| random.next() as u8)
                .collect()
        }
        6 => {
            bytes = format!(
                "{{\"kind\":\"k\",\"labels\":{{{}}}}}",
                (0..100)
                    .map(|i| format!("\"l{i}\":\"v\""))
                    .collect::<Vec<_>>()
                    .join(",")
            )
            .into_bytes()
        }
        _ => {}
    }
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_submissions_never_get_a_server_error() {
    let dir = tempfile::tempdir().unwrap();
    // Durability is not under test here; skipping fdatasync keeps 1,500 sequential cases quick.
    let server = Server::start_with(dir.path(), &["--fdatasync", "false"]);
    let client = http();
    let mut random = Random(SEED);
    let mut seen = std::collections::BTreeMap::new();
    for case in 0..CASES {
        let body = valid(&mut random);
        let bytes = mutate(&mut random, body);
        let route = if random.below(5) == 0 {
            "/v1/tasks:batch"
        } else {
            "/v1/tasks"
        };
        let sent = client
            .post(server.endpoint(route))
            .header("content-type", "application/json")
            .body(bytes.clone())
            .send()
            .await
            .unwrap_or_else(|e| panic!("case {case} (seed {SEED:#x}): no answer: {e}"));
        let answer = answer(sent).await;
        *seen.entry(answer.status).or_insert(0) += 1;
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        assert!(
            answer.status < 500,
            "case {case} (seed {SEED:#x}) got {}: {shown}",
            answer.status
        );
        if answer.status >= 400 {
            assert_eq!(
                answer.content_type, "application/problem+json",
                "case {case}: {shown}"
            );
            assert!(
                answer.body["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("urn:sluice:problem:"))
            );
        }
    }
    assert!(
        seen.keys().any(|&s| s < 300) && seen.keys().any(|&s| s >= 400),
        "both kinds of answer: {seen:?}"
    );
    assert_eq!(
        get_json(&client, &server.endpoint("/healthz")).await.status,
        200
    );
    let tasks = all_tasks(&client, &server).await;
    let mut keys: Vec<&str> = tasks.iter().filter_map(|t| t["key"].as_str()).collect();
    let before = keys.len();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), before, "no key names two tasks");
}
