//! A test shell around the engine: tasks in a map instead of a store, virtual time, seeded
//! random bits and the native decider, so a whole run replays from its seed.

use super::{Due, Engine, EngineOptions, Pick, Report, Verdict, judge_report};
use crate::model::{
    Actor, FailureClass, Gpu, Heartbeat, Priority, Submission, Task, TaskId, TaskSpec, WorkerEvent,
};
use crate::scheduler::{Decider, NativeDecider};
use crate::store::Change;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};

pub struct World {
    pub engine: Engine,
    pub tasks: HashMap<TaskId, Task>,
    pub now_ms: u64,
    pub rng: SmallRng,
    pub decider: NativeDecider,
    /// Every event and worker event, in order: the run's transcript.
    pub log: Vec<String>,
    pub worker_events: Vec<WorkerEvent>,
    next_aging_ms: u64,
}

impl World {
    pub fn new(seed: u64, options: EngineOptions) -> World {
        World {
            engine: Engine::new(options),
            tasks: HashMap::new(),
            now_ms: 1_000_000,
            rng: SmallRng::seed_from_u64(seed),
            decider: NativeDecider::default(),
            log: Vec::new(),
            worker_events: Vec::new(),
            next_aging_ms: 0,
        }
    }

    pub fn commit(&mut self, change: Change) {
        self.engine.apply(&change);
        for event in &change.events {
            self.log.push(format!(
                "{} {} {} {:?}->{} {}",
                event.seq,
                event.at_ms,
                event.task_id,
                event.from,
                event.to,
                event.detail.as_deref().unwrap_or("")
            ));
        }
        for event in &change.worker_events {
            self.log.push(format!(
                "w{} {} {} {}->{} {}",
                event.seq, event.at_ms, event.worker, event.from, event.to, event.reason
            ));
        }
        self.worker_events.extend(change.worker_events);
        for write in change.writes {
            self.tasks.insert(write.task.id, write.task);
        }
    }

    pub fn submit(&mut self, priority: Priority, spec_extra: serde_json::Value) -> TaskId {
        let mut spec = serde_json::json!({"kind": "oct.scan", "priority": priority});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            spec.extend(extra.clone());
        }
        let spec: TaskSpec = serde_json::from_value(spec).unwrap();
        let submission: Submission = spec
            .into_submission(None, &crate::model::Limits::default())
            .unwrap();
        let admission = self.decider.admit(
            self.now_ms,
            self.engine.next_event_seq(),
            &[&submission.spec],
        )[0];
        let random = self.rng.random();
        let change = self
            .engine
            .plan_create(self.now_ms, random, &submission, &admission);
        let id = change.writes[0].task.id;
        self.commit(change);
        id
    }

    pub fn heartbeat(&mut self, worker: &str, gpus: usize, max_concurrency: u32) {
        let heartbeat = Heartbeat {
            gpus: (0..gpus)
                .map(|_| Gpu {
                    model: "A100".into(),
                    memory_mb: 40_000,
                    free: true,
                })
                .collect(),
            max_concurrency,
            ..Heartbeat::default()
        };
        self.engine
            .heartbeat(self.now_ms, worker, heartbeat)
            .unwrap();
    }

    /// Claims up to `max` tasks for `worker`; the leased tasks.
    pub fn claim(&mut self, worker: &str, max: usize) -> Vec<Task> {
        let (picked, event) = self.engine.pick(self.now_ms, worker, max);
        if let Some(event) = event {
            self.commit(Change {
                worker_events: vec![event],
                ..Change::default()
            });
        }
        let Ok(picks) = picked else {
            return Vec::new();
        };
        let mut leased = Vec::new();
        for Pick { task, gpu } in picks {
            let task = self.tasks[&task].clone();
            let random = self.rng.random();
            let change = self
                .engine
                .plan_claim(self.now_ms, random, &task, worker, gpu)
                .unwrap();
            leased.push(change.writes[0].task.clone());
            self.commit(change);
        }
        leased
    }

    /// A report as the writer handles it; the verdict.
    pub fn report(&mut self, id: TaskId, token: &str, report: Report) -> Verdict {
        let task = self.tasks[&id].clone();
        let verdict = judge_report(self.now_ms, &task, token, &report);
        match (&verdict, report) {
            (Verdict::Fresh, Report::Start) => {
                let change = self.engine.plan_start(self.now_ms, &task).unwrap();
                self.commit(change);
            }
            (Verdict::Fresh, Report::Heartbeat) => {
                let change = self.engine.plan_lease_heartbeat(self.now_ms, &task);
                self.commit(change);
            }
            (Verdict::Fresh, Report::Complete { result }) => {
                let mut change = self
                    .engine
                    .plan_complete(self.now_ms, &task, result)
                    .unwrap();
                change
                    .worker_events
                    .extend(self.engine.record_outcome(self.now_ms, &task, None));
                self.commit(change);
            }
            (Verdict::Fresh, Report::Fail { class, message }) => {
                self.fail(&task, class, message, Actor::new("worker"));
            }
            (Verdict::Stale(reason), report) => {
                let change =
                    self.engine
                        .plan_refused_report(self.now_ms, &task, "w", &report, reason);
                self.commit(change);
            }
            (Verdict::Replay, _) => {}
        }
        verdict
    }

    fn fail(&mut self, task: &Task, class: FailureClass, message: String, actor: Actor) {
        let failure = super::failure_view(task, class, self.rng.random());
        let decided = self.decider.retry(self.now_ms, &[failure]);
        let decision = decided.answer[0].clone();
        let mut change = self
            .engine
            .plan_failure(self.now_ms, task, class, message, decision, None, actor)
            .unwrap();
        change
            .worker_events
            .extend(self.engine.record_outcome(self.now_ms, task, Some(class)));
        self.commit(change);
    }

    /// Advances the clock by `step_ms` and runs what the writer's tick runs.
    pub fn tick(&mut self, step_ms: u64, aging_interval_ms: u64) {
        self.now_ms += step_ms;
        for id in self.engine.due(self.now_ms, 10_000) {
            let task = self.tasks[&id].clone();
            match self.engine.due_action(self.now_ms, &task) {
                Some(Due::Deadline) => {
                    let change = self.engine.plan_timed_out(self.now_ms, &task).unwrap();
                    self.commit(change);
                }
                Some(Due::Release) => {
                    let change = self.engine.plan_release(self.now_ms, &task).unwrap();
                    self.commit(change);
                }
                Some(Due::Failed(class)) => {
                    self.fail(&task, class, "expired".into(), Actor::scheduler());
                }
                // The simulation's receivers answer at once.
                Some(Due::Callback) => {
                    let now_ms = self.now_ms;
                    if let Some((attempt, change)) =
                        self.engine.plan_callback_attempt(now_ms, &task)
                    {
                        self.commit(change);
                        let task = self.tasks[&id].clone();
                        let delivered = super::CallbackOutcome::Delivered { status: 200 };
                        if let Some(change) = self
                            .engine
                            .plan_callback_outcome(now_ms, &task, attempt, &delivered)
                        {
                            self.commit(change);
                        }
                    }
                }
                // The simulation has no split families.
                Some(Due::Merge) | None => {}
            }
        }
        if self.now_ms >= self.next_aging_ms {
            self.next_aging_ms = self.now_ms + aging_interval_ms;
            let waiting = self.engine.aging_views(4096);
            let views: Vec<_> = waiting.iter().map(|(_, v)| *v).collect();
            let decided = self.decider.age(self.now_ms, &views);
            for (index, to) in decided.answer {
                let task = self.tasks[&waiting[index as usize].0].clone();
                if let Some(change) = self.engine.plan_promote(self.now_ms, &task, to, None) {
                    self.commit(change);
                }
            }
        }
    }

    pub fn states(&self) -> BTreeMap<crate::model::State, usize> {
        let mut counts = BTreeMap::new();
        for task in self.tasks.values() {
            *counts.entry(task.state).or_default() += 1;
        }
        counts
    }
}
