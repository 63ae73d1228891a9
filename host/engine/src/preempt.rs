//! Preemption: an urgent task that has waited `preempt_after_ms` with no worker free to run it
//! takes the place of a running attempt of a lower bucket. The attempt's lease is revoked (its
//! worker hears `attempt-revoked` at its next report and stops it), the place it frees is kept
//! for the urgent task, and the stopped task waits in its queue again with no attempt spent.

use super::Engine;
use super::breaker::BreakerState;
use super::concurrency::Picked;
use sluice_model::{Actor, Change, IllegalTransition, Priority, State, Task, TaskId};

/// Urgent tasks looked at per tick, first in line first.
const SCAN_PER_TICK: usize = 64;

/// One attempt to stop, on `worker`, so that `urgent` can run there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preemption {
    pub victim: TaskId,
    pub worker: String,
    pub urgent: TaskId,
}

/// Where preemption may look this tick.
struct Candidates {
    /// Workers with a place free.
    free: Vec<String>,
    /// (rank, worker, attempt), best victim first.
    victims: Vec<((usize, u64, TaskId), String, TaskId)>,
}

/// A place being freed for an urgent task: `worker`'s next claim gets `urgent` first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub worker: String,
    pub at_ms: u64,
}

impl Engine {
    /// The preemptions due at `now_ms`, each already counted (its worker's interval has
    /// begun, its place is reserved): at most one per waiting urgent task, and one per worker
    /// every `preempt_after_ms`. Plan each with `plan_revoke`.
    pub fn preemptions_due(&mut self, now_ms: u64) -> Vec<Preemption> {
        let Some(after_ms) = self.options.preempt_after_ms.filter(|_| !self.draining) else {
            return Vec::new();
        };
        // A reservation whose urgent task left the queue, or whose worker never claimed it
        // (it died while stopping the attempt), is dropped: the task may preempt again.
        let keep_ms = after_ms.saturating_add(self.options.lease_ms);
        let queues = &self.queues;
        self.reserved.retain(|urgent, reservation| {
            queues.get(*urgent).is_some() && now_ms.saturating_sub(reservation.at_ms) <= keep_ms
        });
        let waiting: Vec<TaskId> = self
            .queues
            .iter(Priority::Urgent)
            .take(SCAN_PER_TICK)
            .filter(|w| now_ms.saturating_sub(w.view.bucket_since_ms) >= after_ms)
            .filter(|w| !self.reserved.contains_key(&w.id))
            .map(|w| w.id)
            .collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        let mut candidates = self.candidates(now_ms, after_ms);
        let mut due = Vec::new();
        for urgent in waiting {
            let Some(found) = self.victim_for(urgent, &candidates) else {
                continue;
            };
            // One preemption per worker an interval: its other attempts are no candidates.
            candidates
                .victims
                .retain(|(_, worker, _)| *worker != found.worker);
            if let Some(worker) = self.workers.get_mut(&found.worker) {
                worker.last_preempted_ms = Some(now_ms);
            }
            self.reserved.insert(
                urgent,
                Reservation {
                    worker: found.worker.clone(),
                    at_ms: now_ms,
                },
            );
            due.push(found);
        }
        due
    }

    /// This tick's view of the fleet, taken once for every waiting urgent task: the fresh,
    /// healthy workers with a place free, and every attempt that may be preempted (not
    /// urgent, preemptible, not revoked yet, on such a worker not asked within `after_ms`),
    /// best victim first: the lowest bucket, then the youngest attempt.
    fn candidates(&self, now_ms: u64, after_ms: u64) -> Candidates {
        let stale_after_ms = self.options.worker_stale_ms;
        let mut free = Vec::new();
        let mut victims = Vec::new();
        for (id, state) in self.workers.iter() {
            if !state.is_fresh(now_ms, stale_after_ms)
                || state.breaker.state() != BreakerState::Closed
            {
                continue;
            }
            if state.free_slots() > 0 {
                free.push(id.clone());
            }
            let may_preempt = state
                .last_preempted_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= after_ms);
            if !may_preempt {
                continue;
            }
            for (&task, held) in &state.leases {
                if held.preemptible && !held.revoked && held.bucket != Priority::Urgent {
                    let rank = (
                        Priority::ALL.len() - held.bucket.index(),
                        u64::MAX - held.claimed_at_ms,
                        task,
                    );
                    victims.push((rank, id.clone(), task));
                }
            }
        }
        victims.sort_unstable();
        Candidates { free, victims }
    }

    /// The attempt to stop for `urgent`, if one would let it run and no place is free: the
    /// first candidate whose place, once free, fits it.
    fn victim_for(&self, urgent: TaskId, candidates: &Candidates) -> Option<Preemption> {
        let waiting = self.queues.get(urgent)?;
        // Held by its own key: a freed place would not help.
        let key = waiting.concurrency_key();
        if !Picked::default().has_room(&self.concurrency_limits, &self.key_use, key) {
            return None;
        }
        let someone_free = candidates.free.iter().any(|id| {
            self.workers
                .get(id)
                .is_some_and(|state| state.fit(waiting, &state.free_gpus()).is_some())
        });
        if someone_free {
            return None;
        }
        candidates
            .victims
            .iter()
            .find(|(_, worker, task)| {
                self.workers.get(worker).is_some_and(|state| {
                    state
                        .fit(waiting, &state.free_gpus_without(Some(*task)))
                        .is_some()
                })
            })
            .map(|(_, worker, task)| Preemption {
                victim: *task,
                worker: worker.clone(),
                urgent,
            })
    }

    /// The urgent tasks whose places are being freed on `worker`: its claims take them first.
    pub fn reserved_for(&self, worker: &str) -> Vec<TaskId> {
        self.reserved
            .iter()
            .filter(|(_, r)| r.worker == worker)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Revokes the lease of `victim`'s attempt for `urgent`: a note on its timeline, naming
    /// the urgent task. Its place stays held until the worker stops.
    pub(crate) fn plan_revoke(&self, now_ms: u64, victim: &Task, urgent: TaskId) -> Change {
        let (attempt, worker) = victim
            .lease
            .as_ref()
            .map_or((0, ""), |l| (l.attempt, l.worker.as_str()));
        let detail = format!(
            "attempt {attempt} on worker {worker} preempted by urgent task {urgent}: \
             the worker is told to stop it"
        );
        self.plan_note(now_ms, victim, Actor::scheduler(), detail, |after| {
            if let Some(lease) = &mut after.lease {
                lease.revoked_at_ms = Some(now_ms);
                lease.revoked_for = Some(urgent);
            }
        })
    }

    /// A revoked attempt is over (its worker stopped it, or its lease ran out): the task goes
    /// through RetryWait back to its queue at once, and the attempt is not counted.
    pub(crate) fn plan_preempted(
        &mut self,
        now_ms: u64,
        task: &Task,
        by_worker: bool,
    ) -> Result<Change, IllegalTransition> {
        let (attempt, worker, urgent) = task.lease.as_ref().map_or((0, "", None), |l| {
            (l.attempt, l.worker.as_str(), l.revoked_for)
        });
        let how = if by_worker {
            format!("stopped on worker {worker}")
        } else {
            format!("not heard of from worker {worker} before its lease ran out")
        };
        let urgent = urgent.map_or_else(String::new, |id| format!(" for urgent task {id}"));
        let detail = format!(
            "attempt {attempt}, preempted{urgent}, {how}; back in its queue, no attempt spent"
        );
        let actor = if by_worker {
            Actor::worker(worker)
        } else {
            Actor::scheduler()
        };
        self.plan_with(
            now_ms,
            task,
            &[State::RetryWait, State::Queued],
            actor,
            Some(detail),
            |after| {
                after.preemptions = after.preemptions.saturating_add(1);
                after.not_before_ms = None;
                if let Some(lease) = &mut after.lease {
                    lease.stopped_at_ms = Some(now_ms);
                }
            },
        )
    }
}
