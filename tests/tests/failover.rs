//! Several replicas on one PostgreSQL: the leader SIGKILLed twice under load loses, doubles and
//! strands nothing; the same key sent to two replicas at once makes one task; a policy
//! activated through one replica decides on another at once. PostgreSQL only (skipped with a
//! line without one).

use sluice_store_postgres::{PgOptions, PgStore};
use sluice_tests::*;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

const REPLICAS: usize = 3;
const WORKERS: usize = 8;
const SUBMITTERS: usize = 8;
const TASKS: usize = 5_000;
const _: () = assert!(
    TASKS.is_multiple_of(SUBMITTERS),
    "each device submits an equal share"
);
/// Long enough that no lease runs out while the replicas change leader: the test is about
/// failover, not about retries (10 s × the priority policy's factors: 15, 20 and 30 s).
const EST_EXEC_MS: u64 = 10_000;

/// The replicas' current URLs, by slot: a restarted replica listens on a new port.
type Slots = Arc<RwLock<Vec<String>>>;

fn slot_url(slots: &Slots, slot: usize) -> String {
    slots.read().unwrap()[slot % REPLICAS].clone()
}

/// Starts one replica on `store` (blocking until it announces: a replica that follows waits
/// until it has seen the leader renew).
async fn start_replica(store_url: &str, dir: PathBuf) -> Server {
    let store_url = store_url.to_owned();
    tokio::task::spawn_blocking(move || {
        Server::launch(
            &dir,
            &["--store", &store_url],
            &[("SLUICE_LOG", "warn")],
            None,
        )
    })
    .await
    .unwrap()
}

/// The slot of the replica named in the lease row, once its lease is live.
async fn leader_slot(store_url: &str, slots: &Slots) -> usize {
    let store_url = store_url.to_owned();
    let slots = slots.clone();
    let started = Instant::now();
    loop {
        let (store_url, slots_now) = (store_url.clone(), slots.read().unwrap().clone());
        let found = tokio::task::spawn_blocking(move || {
            let store = PgStore::open(&store_url, &PgOptions::default()).expect("open the store");
            let leader = store.leader().expect("read the lease");
            let url = format!("http://{}", leader.address);
            slots_now
                .iter()
                .position(|slot| *slot == url)
                .filter(|_| leader.live)
        })
        .await
        .unwrap();
        if let Some(slot) = found {
            return slot;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no replica leads"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Retries on what a change of leader looks like to a client: no connection, or 503.
fn retryable(sent: &Result<reqwest::Response, reqwest::Error>) -> bool {
    match sent {
        Err(_) => true,
        Ok(response) => matches!(response.status().as_u16(), 429 | 503),
    }
}

fn submission(c: usize, n: usize) -> Value {
    let priority = ["urgent", "normal", "low"][n % 3];
    json!({"kind": "oct.analyze", "key": format!("failover-{c}-{n}"),
           "device": format!("scanner-{c}"), "priority": priority,
           "est_exec_ms": EST_EXEC_MS, "payload": {"c": c, "n": n}})
}

/// One device: submits its share, each until acknowledged, trying the next replica after a
/// failure. Returns key → id.
async fn submitter(
    c: usize,
    slots: Slots,
    acked: Arc<AtomicUsize>,
    count: usize,
) -> HashMap<String, String> {
    let client = http();
    let mut ids = HashMap::new();
    let mut slot = c;
    for n in 0..count {
        let body = submission(c, n);
        let started = Instant::now();
        loop {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "submission {c}-{n} never acknowledged"
            );
            let sent = client
                .post(format!("{}/v1/tasks", slot_url(&slots, slot)))
                .json(&body)
                .send()
                .await;
            if retryable(&sent) {
                slot += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let answer = answer(sent.unwrap()).await;
            assert!(
                matches!(answer.status, 200 | 201),
                "submission {c}-{n}: {answer:?}"
            );
            let id = answer.body["id"].as_str().unwrap().to_owned();
            ids.insert(body["key"].as_str().unwrap().to_owned(), id);
            acked.fetch_add(1, Ordering::Relaxed);
            break;
        }
    }
    ids
}

/// Lease tokens a worker's completion was answered 200 for, by task.
type Completions = Arc<Mutex<HashMap<String, HashSet<String>>>>;

/// One GPU worker: heartbeats, claims, completes at once; after a failure it heartbeats again
/// through the next replica (a new leader has not heard from it yet), and sends a claim that
/// got no answer again under the same id, so the leases it granted come back.
async fn worker(w: usize, slots: Slots, done: Arc<AtomicBool>, completions: Completions) {
    let client = http();
    let id = format!("gpu-{w}");
    let mut slot = w;
    let mut heartbeat_at: Option<Instant> = None;
    let mut claims = 0;
    let mut unanswered_claim: Option<String> = None;
    while !done.load(Ordering::Acquire) {
        let base = slot_url(&slots, slot);
        if heartbeat_at.is_none_or(|at| at.elapsed() > Duration::from_secs(1)) {
            let body =
                json!({"gpus": [{"model": "A100", "memory_mb": 40000}], "max_concurrency": 4});
            let sent = client
                .post(format!("{base}/v1/workers/{id}/heartbeat"))
                .json(&body)
                .send()
                .await;
            if retryable(&sent) {
                slot += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            let answer = answer(sent.unwrap()).await;
            assert_eq!(answer.status, 200, "heartbeat: {answer:?}");
            heartbeat_at = Some(Instant::now());
        }
        let claim_id = unanswered_claim.take().unwrap_or_else(|| {
            claims += 1;
            format!("{id}-{claims}")
        });
        let sent = client
            .post(format!("{base}/v1/workers/{id}/claim"))
            .json(&json!({"max": 4, "wait_ms": 300, "claim_id": claim_id}))
            .send()
            .await;
        if retryable(&sent) {
            (slot, heartbeat_at) = (slot + 1, None);
            unanswered_claim = Some(claim_id);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let claim = answer(sent.unwrap()).await;
        if claim.status != 200 {
            // A new leader that has not had this worker's heartbeat refuses the claim.
            heartbeat_at = None;
            continue;
        }
        for lease in claim.body["leases"].as_array().unwrap() {
            let task = lease["task"]["id"].as_str().unwrap().to_owned();
            let token = lease["lease_token"].as_str().unwrap().to_owned();
            let body = json!({"lease_token": token, "result": {"by": id}});
            // The same report again after a failure: the lease is rebuilt by the new leader,
            // or the first try landed and this one is refused; either way nothing doubles.
            let reporting = Instant::now();
            loop {
                assert!(
                    reporting.elapsed() < Duration::from_secs(60),
                    "the completion of {task} never got an answer"
                );
                let sent = client
                    .post(format!(
                        "{}/v1/tasks/{task}/complete",
                        slot_url(&slots, slot)
                    ))
                    .json(&body)
                    .send()
                    .await;
                if retryable(&sent) {
                    slot += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                if sent.unwrap().status().as_u16() == 200 {
                    completions
                        .lock()
                        .unwrap()
                        .entry(task.clone())
                        .or_default()
                        .insert(token.clone());
                }
                break;
            }
        }
    }
}

/// SIGKILLs the leader, then polls the survivors until one answers: how long the API was away.
async fn kill_leader(
    store_url: &str,
    slots: &Slots,
    servers: &mut [Option<Server>],
) -> (usize, Duration) {
    let slot = leader_slot(store_url, slots).await;
    servers[slot].take().unwrap().kill9();
    let killed = Instant::now();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    loop {
        for other in (0..REPLICAS).filter(|&other| other != slot) {
            let url = format!("{}/v1/stats", slot_url(slots, other));
            if let Ok(response) = client.get(url).send().await
                && response.status() == 200
            {
                return (slot, killed.elapsed());
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "no replica answered after the leader was killed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_twice_loses_doubles_and_strands_nothing() {
    let Some(store) = TestStore::postgres() else {
        return;
    };
    let TestStore::Postgres(store_url) = &store else {
        unreachable!()
    };
    let dirs: Vec<_> = (0..REPLICAS)
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let mut servers = Vec::new();
    for dir in &dirs {
        servers.push(Some(start_replica(store_url, dir.path().to_owned()).await));
    }
    let slots: Slots = Arc::new(RwLock::new(
        servers
            .iter()
            .map(|server| server.as_ref().unwrap().url.clone())
            .collect(),
    ));
    let started = Instant::now();
    let acked = Arc::new(AtomicUsize::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    for c in 0..SUBMITTERS {
        submitters.spawn(submitter(
            c,
            slots.clone(),
            acked.clone(),
            TASKS / SUBMITTERS,
        ));
    }
    let done = Arc::new(AtomicBool::new(false));
    let completions: Completions = Arc::default();
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        workers.spawn(worker(w, slots.clone(), done.clone(), completions.clone()));
    }
    let client = http();
    let completed = |client: reqwest::Client, slots: Slots| async move {
        for slot in 0..REPLICAS {
            let url = format!("{}/v1/stats", slot_url(&slots, slot));
            if let Ok(response) = client.get(url).send().await
                && response.status() == 200
            {
                let stats = answer(response).await;
                return stats.body["tasks_by_state"]["completed"]
                    .as_u64()
                    .unwrap_or(0) as usize;
            }
        }
        0
    };

    // The first kill while devices are still submitting, the second while workers finish.
    let mut gaps = Vec::new();
    for kill in 0..2 {
        if kill == 0 {
            wait_for("40% acknowledged", Duration::from_secs(120), || {
                let acked = acked.load(Ordering::Relaxed);
                async move { (acked >= TASKS * 2 / 5).then_some(()) }
            })
            .await;
        } else {
            wait_for("60% completed", Duration::from_secs(180), || {
                let (client, slots) = (client.clone(), slots.clone());
                async move { (completed(client, slots).await >= TASKS * 3 / 5).then_some(()) }
            })
            .await;
        }
        let (slot, gap) = kill_leader(store_url, &slots, &mut servers).await;
        println!(
            "kill {}: leader in slot {slot} SIGKILLed; the API answered again after {} ms",
            kill + 1,
            gap.as_millis()
        );
        gaps.push(gap);
        // Back to three replicas: the killed one restarts and follows the new leader.
        let restarted = start_replica(store_url, dirs[slot].path().to_owned()).await;
        slots.write().unwrap()[slot] = restarted.url.clone();
        servers[slot] = Some(restarted);
    }

    let mut ids = HashMap::new();
    while let Some(share) = submitters.join_next().await {
        ids.extend(share.unwrap());
    }
    assert_eq!(ids.len(), TASKS);
    wait_for("every task completed", Duration::from_secs(300), || {
        let (client, slots) = (client.clone(), slots.clone());
        async move { (completed(client, slots).await >= TASKS).then_some(()) }
    })
    .await;
    done.store(true, Ordering::Release);
    while let Some(stopped) = workers.join_next().await {
        stopped.unwrap();
    }
    let elapsed = started.elapsed();

    let leader = servers[leader_slot(store_url, &slots).await]
        .as_ref()
        .unwrap();
    let tasks = all_tasks(&client, leader).await;
    assert_eq!(tasks.len(), TASKS, "a task too many or too few");
    let distinct: HashSet<&String> = ids.values().collect();
    assert_eq!(distinct.len(), TASKS, "two keys share a task");
    for task in &tasks {
        assert_eq!(task["state"], "completed", "{task}");
        // A claim whose answer died with a leader came back to its worker when it asked
        // again: nothing waited for an attempt to time out.
        assert_eq!(task["attempt"], 1, "stranded until a retry: {task}");
    }
    let events = all_events(&client, leader).await;
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "the event log has a gap"
    );
    let mut completed_events: HashMap<&str, usize> = HashMap::new();
    for event in events.iter().filter(|e| e["to"] == "completed") {
        *completed_events
            .entry(event["task_id"].as_str().unwrap())
            .or_default() += 1;
    }
    for id in ids.values() {
        assert_eq!(
            completed_events.get(id.as_str()),
            Some(&1),
            "task {id} did not complete exactly once"
        );
    }
    for (task, tokens) in completions.lock().unwrap().iter() {
        assert_eq!(tokens.len(), 1, "task {task} completed under two leases");
    }
    let worst = gaps.iter().max().unwrap();
    println!(
        "{TASKS} tasks through {REPLICAS} replicas and {WORKERS} workers, leader killed twice: \
         {:.1} s, {} events, worst gap {} ms",
        elapsed.as_secs_f64(),
        seqs.len(),
        worst.as_millis()
    );
    assert!(
        *worst < Duration::from_secs(5),
        "the API was away {} ms after a kill",
        worst.as_millis()
    );
}

/// Every event of the global log, oldest first.
async fn all_events(client: &reqwest::Client, server: &Server) -> Vec<Value> {
    let mut events: Vec<Value> = Vec::new();
    loop {
        let after = events.last().map_or(0, |e| e["seq"].as_u64().unwrap());
        let url = server.endpoint(&format!("/v1/events?after={after}&limit=1000"));
        let page = get_json(client, &url).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let page = page.body["events"].as_array().unwrap().clone();
        if page.is_empty() {
            return events;
        }
        events.extend(page);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_key_sent_to_two_replicas_at_once_makes_one_task() {
    let Some(store) = TestStore::postgres() else {
        return;
    };
    let TestStore::Postgres(store_url) = &store else {
        unreachable!()
    };
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = start_replica(store_url, first_dir.path().to_owned()).await;
    let second = start_replica(store_url, second_dir.path().to_owned()).await;
    let client = http();
    const KEYS: usize = 50;
    let (first_url, second_url) = (first.endpoint("/v1/tasks"), second.endpoint("/v1/tasks"));
    for n in 0..KEYS {
        let body = json!({"kind": "oct.analyze", "key": format!("both-{n}"), "payload": {"n": n}});
        let (a, b) = tokio::join!(
            post_json(&client, &first_url, &body),
            post_json(&client, &second_url, &body)
        );
        let mut statuses = [a.status, b.status];
        statuses.sort_unstable();
        assert_eq!(
            statuses,
            [200, 201],
            "one creates, one replays: {a:?} {b:?}"
        );
        assert_eq!(a.body["id"], b.body["id"], "two tasks for key both-{n}");
    }
    let tasks = all_tasks(&client, &second).await;
    assert_eq!(tasks.len(), KEYS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_policy_activated_through_one_replica_decides_on_another_at_once() {
    let Some(store) = TestStore::postgres() else {
        return;
    };
    let TestStore::Postgres(store_url) = &store else {
        unreachable!()
    };
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut replicas = Vec::new();
    for dir in &dirs {
        replicas.push(start_replica(store_url, dir.path().to_owned()).await);
    }
    let client = http();
    let submit_normal = |server: &Server| {
        let (client, url) = (client.clone(), server.endpoint("/v1/tasks"));
        async move {
            let spec = json!({"kind": "oct.analyze", "priority": "normal", "est_exec_ms": 1000, "payload": {}});
            let created = post_json(&client, &url, &spec).await;
            assert_eq!(created.status, 201, "{:?}", created.body);
            created.body["attempt_timeout_ms"].clone()
        }
    };
    assert_eq!(submit_normal(&replicas[2]).await, 2000);
    let priority = policy_component("priority-buckets", None);
    let uploaded = put_policy(
        &client,
        &replicas[0],
        "priority",
        priority,
        Some("normal_timeout_factor=5"),
    )
    .await;
    assert_eq!(uploaded.status, 201, "{:?}", uploaded.body);
    let activate = replicas[0].endpoint("/v1/policies/priority/activate");
    let activated = post_json(&client, &activate, &json!({"version": 1})).await;
    assert_eq!(activated.status, 200, "{:?}", activated.body);
    let since = Instant::now();
    assert_eq!(submit_normal(&replicas[2]).await, 5000);
    let took = since.elapsed();
    println!(
        "activated through replica 1, decided on replica 3 {} ms later",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(1));
}
