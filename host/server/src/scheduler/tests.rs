//! The writer and flusher threads over a real store (the default backend), with a fault-injecting wrapper where
//! a test needs a commit to fail or a sync to wait.

use super::*;
use sluice_engine::testing::EngineTestSupport;
use sluice_engine::{NativeDecider, StepError};
use sluice_model::{Change, KeyRecord, Limits, Recovery, State, TaskSpec};
use sluice_store::{ListPage, ListQuery};
use sluice_store_sled::{SledOptions, SledStore};
use std::sync::atomic::{AtomicBool, Ordering};

/// A clock that reads a fixed time.
struct FixedClock(u64);

impl Clock for FixedClock {
    fn now_ms(&self) -> u64 {
        self.0
    }
}

/// A gate a store call waits at while it is held, counting the calls that came to it.
#[derive(Default)]
struct StoreGate(
    std::sync::Mutex<bool>,
    std::sync::Condvar,
    std::sync::atomic::AtomicUsize,
);

impl StoreGate {
    fn hold(&self, held: bool) {
        *self.0.lock().unwrap() = held;
        self.1.notify_all();
    }

    fn pass(&self) {
        self.2.fetch_add(1, Ordering::SeqCst);
        drop(self.1.wait_while(self.0.lock().unwrap(), |held| *held));
    }

    fn arrivals(&self) -> usize {
        self.2.load(Ordering::SeqCst)
    }
}

/// The real store, except that `commit` waits while `commits_held` and then fails while
/// `fail_commits` is set, `sync` waits while `syncs_held` is, `check_space` while
/// `space_held` is, and a read of keys ahead answers (having read) once `key_reads_held` is
/// not. `remote` makes it say it is across the network, so the writer commits through its
/// pipeline and reads keys ahead; there it counts the groups of submissions handed over
/// (`submission_groups_planned`), which tells a test a group is planned while commits wait.
struct FlakyStore {
    inner: SledStore,
    fail_commits: AtomicBool,
    commits_held: StoreGate,
    syncs_held: StoreGate,
    space_held: StoreGate,
    key_reads_held: StoreGate,
    remote: bool,
    /// Payloads read so far.
    payload_reads: std::sync::atomic::AtomicUsize,
    /// Groups with new tasks encoded ahead (`prepare_commit`), on the pipelined path.
    submission_groups_planned: std::sync::atomic::AtomicUsize,
}

impl FlakyStore {
    fn new(dir: &std::path::Path) -> FlakyStore {
        FlakyStore {
            inner: SledStore::open(dir, &SledOptions::default()).unwrap(),
            fail_commits: AtomicBool::new(false),
            commits_held: StoreGate::default(),
            syncs_held: StoreGate::default(),
            space_held: StoreGate::default(),
            key_reads_held: StoreGate::default(),
            remote: false,
            payload_reads: Default::default(),
            submission_groups_planned: Default::default(),
        }
    }

    fn remote(dir: &std::path::Path) -> FlakyStore {
        FlakyStore {
            remote: true,
            ..FlakyStore::new(dir)
        }
    }

    fn hold_syncs(&self, held: bool) {
        self.syncs_held.hold(held);
    }
}

impl Store for FlakyStore {
    fn is_remote(&self) -> bool {
        self.remote
    }
    fn prepare_commit(
        &self,
        change: &Change,
    ) -> Result<Option<sluice_store::PreparedCommit>, StoreError> {
        if !change.new_tasks.is_empty() {
            self.submission_groups_planned
                .fetch_add(1, Ordering::SeqCst);
        }
        self.inner.prepare_commit(change)
    }
    fn commit(&self, change: &Change) -> Result<(), StoreError> {
        self.commits_held.pass();
        if self.fail_commits.load(Ordering::SeqCst) {
            return Err(StoreError::Io(std::io::Error::other(
                "injected commit failure",
            )));
        }
        self.inner.commit(change)
    }
    fn sync(&self) -> Result<(), StoreError> {
        self.syncs_held.pass();
        self.inner.sync()
    }
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        self.inner.task(id)
    }
    fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError> {
        self.payload_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.payload(id)
    }
    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.inner.key(key)
    }
    fn keys(
        &self,
        keys: &[&str],
    ) -> Result<std::collections::HashMap<String, KeyRecord>, StoreError> {
        let found = self.inner.keys(keys);
        self.key_reads_held.pass();
        found
    }
    fn check_space(&self) -> Result<(), StoreError> {
        self.space_held.pass();
        self.inner.check_space()
    }
    fn events_of(
        &self,
        id: TaskId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<sluice_model::Event>>, StoreError> {
        self.inner.events_of(id, after_seq, limit)
    }
    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.inner.list(query)
    }
    fn events_after(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<sluice_model::Event>, StoreError> {
        self.inner.events_after(after_seq, limit)
    }
    fn worker_events(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<sluice_model::WorkerEvent>, StoreError> {
        self.inner.worker_events(after_seq, limit)
    }
    fn recover(&self) -> Result<Recovery, StoreError> {
        self.inner.recover()
    }
}

fn submission(key: Option<&str>, payload: serde_json::Value) -> Submission {
    let spec: TaskSpec =
        serde_json::from_value(serde_json::json!({"kind": "k", "key": key, "payload": payload}))
            .unwrap();
    spec.into_submission(None, &Limits::default()).unwrap()
}

fn start(store: Arc<dyn Store>) -> Scheduler {
    start_with(store, &SchedulerOptions::default())
}

fn start_with(store: Arc<dyn Store>, options: &SchedulerOptions) -> Scheduler {
    Scheduler::start(
        store,
        Box::new(FixedClock(1_000)),
        Arc::new(NativeDecider::default()),
        options,
    )
    .unwrap()
}

/// Registers `worker` and queues `tasks` tasks, all synced.
async fn worker_and_tasks(scheduler: &Scheduler, worker: &str, tasks: usize) {
    let heartbeat: Heartbeat =
        serde_json::from_value(serde_json::json!({"max_concurrency": 8})).unwrap();
    scheduler
        .heartbeat(worker.to_owned(), heartbeat)
        .await
        .unwrap();
    let submissions = (0..tasks)
        .map(|n| submission(None, serde_json::json!(n)))
        .collect();
    for answer in scheduler.submit_many(submissions).await.unwrap() {
        answer.unwrap();
    }
}

/// Waits until a group that leaves `count` tasks in `state` is committed: the snapshot is
/// published once the commit is written, before its answers. Bounded, so a bug fails the
/// test instead of hanging it.
async fn until_in_state(scheduler: &Scheduler, state: State, count: u64) {
    for _ in 0..5_000 {
        if scheduler.snapshot().tasks_by_state[&state] >= count {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("the writer never left {count} tasks {state}");
}

#[tokio::test]
async fn a_claim_is_answered_once_written_and_a_report_once_synced() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FlakyStore::new(dir.path()));
    let scheduler = Arc::new(start(store.clone()));
    worker_and_tasks(&scheduler, "w", 1).await;

    store.hold_syncs(true);
    let claim = scheduler.claim("w".into(), 1, None, None);
    let claimed = tokio::time::timeout(std::time::Duration::from_secs(10), claim)
        .await
        .expect("the claim waited for a sync")
        .unwrap();
    let task = claimed.claimed.leases[0].clone();
    let token = task.lease.clone().unwrap().token;
    let start = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.report(task.id, token, Report::Start).await }
    });
    until_in_state(&scheduler, State::Running, 1).await;
    tokio::task::yield_now().await;
    assert!(
        !start.is_finished(),
        "a report was answered before its sync"
    );
    store.hold_syncs(false);
    let started = start.await.unwrap().unwrap();
    assert_eq!(started.state, State::Running);
    scheduler.shutdown().await;
}

/// A client that reads after its answer sees what its request changed: a group's snapshot is
/// published with its commit, before its answers can go out. Here the writer is kept from returning
/// after the claim's answer (the flusher is held in a sync and its one-slot queue is full), so
/// a snapshot published after the group would still show the task queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_shows_a_claim_by_the_time_it_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FlakyStore::new(dir.path()));
    let options = SchedulerOptions {
        queue_capacity: 1,
        tick_ms: 3_600_000,
        ..SchedulerOptions::default()
    };
    let scheduler = Arc::new(start_with(store.clone(), &options));
    worker_and_tasks(&scheduler, "w", 1).await;

    // Counted before the first submission goes in: the flusher may reach its sync at once.
    let synced_before = store.syncs_held.arrivals();
    store.hold_syncs(true);
    let submit = |n: i32| {
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            scheduler
                .submit_many(vec![submission(None, serde_json::json!(n))])
                .await
        })
    };
    let first = submit(1);
    until("the flusher to wait in a sync", || {
        store.syncs_held.arrivals() > synced_before
    })
    .await;
    let second = submit(2);
    until_in_state(&scheduler, State::Queued, 3).await;

    let claim = scheduler.claim("w".into(), 1, None, None);
    let claimed = tokio::time::timeout(std::time::Duration::from_secs(10), claim)
        .await
        .expect("the claim waited for a sync")
        .unwrap();
    assert_eq!(claimed.claimed.leases.len(), 1);
    assert_eq!(
        scheduler.snapshot().tasks_by_state[&State::Claimed],
        1,
        "the claim was answered before the snapshot showed it"
    );

    store.hold_syncs(false);
    for submitted in [first, second] {
        submitted.await.unwrap().unwrap()[0].as_ref().unwrap();
    }
    scheduler.shutdown().await;
}

/// Readers of the snapshot (stats, status, metrics) see a group only once the store has taken
/// its commit: while the commit waits they see what was there before, and a commit the store
/// refuses is never shown. Inline (the embedded store) and through the committer's pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_shows_a_group_only_once_its_commit_is_written() {
    for remote in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(if remote {
            FlakyStore::remote(dir.path())
        } else {
            FlakyStore::new(dir.path())
        });
        let scheduler = Arc::new(start(store.clone()));
        worker_and_tasks(&scheduler, "w", 1).await;
        let queued = |scheduler: &Scheduler| {
            let snapshot = scheduler.snapshot();
            snapshot
                .tasks_by_state
                .get(&State::Queued)
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(queued(&scheduler), 1);

        // A commit that waits, then is written: shown only once written. Then one that waits,
        // then fails: never shown, before or after.
        for (fails, shown) in [(false, 2), (true, 2)] {
            store.fail_commits.store(fails, Ordering::SeqCst);
            let arrived = store.commits_held.arrivals();
            store.commits_held.hold(true);
            let submitted = tokio::spawn({
                let scheduler = scheduler.clone();
                async move {
                    scheduler
                        .submit_many(vec![submission(None, serde_json::json!("late"))])
                        .await
                }
            });
            until("the commit to wait", || {
                store.commits_held.arrivals() > arrived
            })
            .await;
            let before = shown - u64::from(!fails);
            let context = format!("remote {remote}, the commit fails {fails}");
            assert_eq!(
                queued(&scheduler),
                before,
                "{context}: shown before its commit"
            );
            store.commits_held.hold(false);
            let accepted = submitted
                .await
                .unwrap()
                .is_ok_and(|answers| answers[0].is_ok());
            assert_eq!(accepted, !fails, "{context}");
            assert_eq!(queued(&scheduler), shown, "{context}");
        }
        store.fail_commits.store(false, Ordering::SeqCst);
        scheduler.shutdown().await;
    }
}

#[tokio::test]
async fn a_claim_brings_the_payloads_the_writer_holds_and_the_store_gives_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FlakyStore::new(dir.path()));
    let scheduler = start(store.clone());
    worker_and_tasks(&scheduler, "w", 3).await;
    let mut answer = scheduler.claim("w".into(), 2, None, None).await.unwrap();
    let held: Vec<Option<&[u8]>> = answer.payloads.iter().map(Option::as_deref).collect();
    assert_eq!(held, [Some(&b"0"[..]), Some(&b"1"[..])]);
    let payloads = scheduler.lease_payloads(&mut answer).unwrap();
    assert_eq!(payloads, [Some(b"0".to_vec()), Some(b"1".to_vec())]);
    assert_eq!(store.payload_reads.load(Ordering::SeqCst), 0);
    scheduler.shutdown().await;

    // A writer started afresh holds no payloads: the third task's comes from the store.
    let scheduler = start(store.clone());
    worker_and_tasks(&scheduler, "w", 0).await;
    let mut answer = scheduler.claim("w".into(), 2, None, None).await.unwrap();
    assert_eq!(answer.payloads, [None]);
    let payloads = scheduler.lease_payloads(&mut answer).unwrap();
    assert_eq!(payloads, [Some(b"2".to_vec())]);
    assert_eq!(store.payload_reads.load(Ordering::SeqCst), 1);
    scheduler.shutdown().await;
}

/// Polls `done` until it holds; bounded, so a bug fails the test instead of hanging it.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..5_000 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    panic!("never: {what}");
}

/// The race the read of keys ahead must survive: a submission's keys are read while the
/// group that adds the same key is still being committed (so the read finds none), the writer
/// plans a claim while the read is out, and that group lands meanwhile (so the writer no
/// longer holds it in flight). The second submission must still find the first one's task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_lands_while_its_read_ahead_is_out_is_still_found() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FlakyStore::remote(dir.path()));
    let options = SchedulerOptions {
        tick_ms: 3_600_000,
        ..SchedulerOptions::default()
    };
    let scheduler = Arc::new(start_with(store.clone(), &options));
    worker_and_tasks(&scheduler, "w", 0).await;
    let submit = |key: &'static str| {
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            scheduler
                .submit(submission(Some(key), serde_json::json!(1)))
                .await
        })
    };

    store.commits_held.hold(true);
    let arrived = store.commits_held.arrivals();
    let first = submit("k");
    until("the first submission's commit waits", || {
        store.commits_held.arrivals() > arrived
    })
    .await;
    // The writer takes a heartbeat and stops before planning it, so that the submission and
    // the claim sent next wait in its inbox together and are taken in one go.
    store.space_held.hold(true);
    let checks = store.space_held.arrivals();
    let heartbeat = tokio::spawn({
        let scheduler = scheduler.clone();
        let heartbeat: Heartbeat =
            serde_json::from_value(serde_json::json!({"max_concurrency": 8})).unwrap();
        async move { scheduler.heartbeat("w".into(), heartbeat).await }
    });
    until("the writer waits to plan the heartbeat", || {
        store.space_held.arrivals() > checks
    })
    .await;
    store.key_reads_held.hold(true);
    let capacity = scheduler.commands.capacity();
    let second = submit("k");
    let claim = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.claim("w".into(), 1, None, None).await }
    });
    until("both wait in the inbox", || {
        scheduler.commands.capacity() + 2 <= capacity
    })
    .await;
    let reads = store.key_reads_held.arrivals();
    store.space_held.hold(false);
    heartbeat.await.unwrap().unwrap();
    until("the second submission's key was read, finding none", || {
        store.key_reads_held.arrivals() > reads
    })
    .await;
    // The claim is planned meanwhile; the first group lands once commits go on.
    store.commits_held.hold(false);
    let claimed = claim.await.unwrap().unwrap();
    assert_eq!(claimed.claimed.leases.len(), 1);
    store.key_reads_held.hold(false);
    let (first, second) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(second.task.id, first.task.id, "the key made two tasks");
    assert!(!first.replayed && second.replayed);
    scheduler.shutdown().await;
}

#[tokio::test]
async fn with_sync_claims_a_claim_waits_for_its_sync() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FlakyStore::new(dir.path()));
    let options = SchedulerOptions {
        sync_claims: true,
        ..SchedulerOptions::default()
    };
    let scheduler = Arc::new(start_with(store.clone(), &options));
    worker_and_tasks(&scheduler, "w", 1).await;

    store.hold_syncs(true);
    let claim = tokio::spawn({
        let scheduler = scheduler.clone();
        async move { scheduler.claim("w".into(), 1, None, None).await }
    });
    until_in_state(&scheduler, State::Claimed, 1).await;
    tokio::task::yield_now().await;
    assert!(!claim.is_finished(), "a claim was answered before its sync");
    store.hold_syncs(false);
    assert_eq!(claim.await.unwrap().unwrap().claimed.leases.len(), 1);
    scheduler.shutdown().await;
}

#[tokio::test]
async fn one_group_sees_its_own_keys_replaying_and_conflicting() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SledStore::open(dir.path(), &SledOptions::default()).unwrap());
    let scheduler = start(store);
    let answers = scheduler
        .submit_many(vec![
            submission(Some("a"), serde_json::json!(1)),
            submission(Some("a"), serde_json::json!(1)),
            submission(Some("a"), serde_json::json!(2)),
            submission(None, serde_json::json!(1)),
        ])
        .await
        .unwrap();
    let first = answers[0].as_ref().unwrap();
    assert!(!first.replayed);
    let replay = answers[1].as_ref().unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.task.id, first.task.id);
    assert!(
        matches!(&answers[2], Err(SchedulerError::Step(StepError::KeyConflict { task_id, .. })) if *task_id == first.task.id)
    );
    assert!(!answers[3].as_ref().unwrap().replayed);
    let snapshot = scheduler.snapshot();
    assert_eq!(snapshot.tasks_by_state[&State::Queued], 2);
    assert_eq!(snapshot.last_event_seq, 4);
    scheduler.shutdown().await;
}

#[tokio::test]
async fn a_failed_commit_is_answered_with_errors_and_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    a_failed_commit_leaves_no_trace(Arc::new(FlakyStore::new(dir.path()))).await;
}

#[tokio::test]
async fn a_failed_commit_through_the_pipeline_leaves_no_trace() {
    let dir = tempfile::tempdir().unwrap();
    a_failed_commit_leaves_no_trace(Arc::new(FlakyStore::remote(dir.path()))).await;
}

async fn a_failed_commit_leaves_no_trace(store: Arc<FlakyStore>) {
    let scheduler = start(store.clone());
    let kept = scheduler
        .submit(submission(Some("kept"), serde_json::json!(1)))
        .await
        .unwrap();

    store.fail_commits.store(true, Ordering::SeqCst);
    let lost = scheduler
        .submit(submission(Some("lost"), serde_json::json!(1)))
        .await;
    assert!(
        matches!(lost, Err(SchedulerError::Step(StepError::Store(_)))),
        "{lost:?}"
    );
    let refused_cancel = scheduler.cancel(kept.task.id, Actor::api()).await;
    assert!(matches!(
        refused_cancel,
        Err(SchedulerError::Step(StepError::Store(_)))
    ));
    store.fail_commits.store(false, Ordering::SeqCst);

    // The engine was rebuilt from the store: no gap in event numbers, no phantom task.
    let snapshot = scheduler.snapshot();
    assert_eq!(snapshot.tasks_by_state[&State::Queued], 1);
    assert_eq!(snapshot.last_event_seq, 2);
    let retried = scheduler
        .submit(submission(Some("lost"), serde_json::json!(1)))
        .await
        .unwrap();
    assert!(
        !retried.replayed,
        "the failed submission left no key behind"
    );
    let events = scheduler.events(retried.task.id, 0, 10).unwrap();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    let cancelled = scheduler.cancel(kept.task.id, Actor::api()).await.unwrap();
    assert_eq!(cancelled.state, State::Cancelled);
    scheduler.shutdown().await;
}

#[tokio::test]
async fn tasks_left_created_are_admitted_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let created_id = {
        let store = SledStore::open(dir.path(), &SledOptions::default()).unwrap();
        // Write a task exactly as a crash between creation and admission would leave it.
        let submitted = submission(Some("half-done"), serde_json::json!({"x": 1}));
        let admission = submitted.native_admission(0);
        let mut change =
            sluice_engine::Engine::default().test_plan_create(500, 7, &submitted, &admission);
        change.events.truncate(1);
        let task = &mut change.writes[0].task;
        task.state = State::Created;
        task.event_seqs.truncate(1);
        let id = task.id;
        store.commit(&change).unwrap();
        store.sync().unwrap();
        id
    };
    let store = Arc::new(SledStore::reopen(dir.path(), &SledOptions::default()).unwrap());
    let scheduler = start(store);
    let task = scheduler.task(created_id).unwrap();
    assert_eq!(task.state, State::Queued);
    let events = scheduler.events(created_id, 0, 10).unwrap();
    let steps: Vec<_> = events.iter().map(|e| (e.seq, e.from, e.to)).collect();
    assert_eq!(
        steps,
        [
            (1, None, State::Created),
            (2, Some(State::Created), State::Queued)
        ]
    );
    assert_eq!(
        scheduler
            .snapshot()
            .queued_by_bucket
            .values()
            .sum::<usize>(),
        1
    );
    scheduler.shutdown().await;
}

/// Through the pipeline, a group planned on top of one whose commit then fails is refused
/// too, although the store would take it, and the engine is rebuilt from the store before the
/// next group: no phantom task, no gap in event numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_behind_a_failed_commit_is_refused_and_the_engine_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FlakyStore::remote(dir.path()));
    let scheduler = Arc::new(start(store.clone()));
    let kept = scheduler
        .submit(submission(Some("kept"), serde_json::json!(1)))
        .await
        .unwrap();

    store.commits_held.hold(true);
    let submit = |key: &'static str| {
        let scheduler = scheduler.clone();
        tokio::spawn(async move {
            scheduler
                .submit(submission(Some(key), serde_json::json!(2)))
                .await
        })
    };
    let planned = |groups: usize| {
        let store = store.clone();
        move || store.submission_groups_planned.load(Ordering::SeqCst) >= groups
    };
    let before = store.submission_groups_planned.load(Ordering::SeqCst);
    let first = submit("first");
    // Planned and handed over, so the next submission goes into a group of its own behind it.
    until("the first group is planned", planned(before + 1)).await;
    let second = submit("second");
    until("the second group is planned", planned(before + 2)).await;
    store.fail_commits.store(true, Ordering::SeqCst);
    store.commits_held.hold(false);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert!(first.is_err(), "{first:?}");
    store.fail_commits.store(false, Ordering::SeqCst);
    assert!(
        matches!(&second, Err(SchedulerError::Step(StepError::Store(_)))),
        "the group behind the failed one is refused: {second:?}"
    );

    let again = scheduler
        .submit(submission(Some("second"), serde_json::json!(2)))
        .await
        .unwrap();
    assert!(!again.replayed, "the refused group left no key behind");
    let snapshot = scheduler.snapshot();
    assert_eq!(snapshot.tasks_by_state[&State::Queued], 2);
    let kept_events = scheduler.events(kept.task.id, 0, 10).unwrap();
    let again_events = scheduler.events(again.task.id, 0, 10).unwrap();
    let last_kept = kept_events.last().unwrap().seq;
    assert_eq!(
        again_events.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [last_kept + 1, last_kept + 2],
        "numbered on from what the store holds"
    );
    assert!(store.key("first").unwrap().is_none());
    scheduler.shutdown().await;
}
