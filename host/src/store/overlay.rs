//! What is committed (in the write-ahead log) but not yet written into sled: each task's latest
//! record and the index entries that still point at an older state, new idempotency keys, large
//! payloads, event blocks and worker log entries. Readers look here first; the materializer
//! drains it.

use super::wal::{CallbackMark, Entry, PendingKey, state_bit};
use crate::model::{State, TaskId};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct Pending {
    pub state: State,
    pub callback: CallbackMark,
    pub index_value: Vec<u8>,
    pub record: Arc<[u8]>,
    /// States whose index entry for this task may be in the tree: the one materialized last,
    /// or after a crash every state the replayed log touched.
    pub stale_index: u16,
    /// The commit that last wrote this task.
    pub commit: u64,
}

#[derive(Default)]
pub struct Overlay {
    pub tasks: HashMap<TaskId, Pending>,
    pub keys: HashMap<String, [u8; 48]>,
    pub payloads: HashMap<TaskId, Arc<[u8]>>,
    /// Event log blocks by first `seq`.
    pub blocks: BTreeMap<u64, Arc<[u8]>>,
    /// Worker log entries by `seq`.
    pub worker_events: BTreeMap<u64, Arc<[u8]>>,
    /// The last commit whose writes are all here.
    pub last_commit: u64,
    /// When the oldest write still here arrived (about: a round resets it).
    pub pending_since: Option<Instant>,
}

/// What one materializer round writes in place: the overlay as it was when the round began.
pub struct Round {
    pub through_commit: u64,
    pub tasks: Vec<(TaskId, Pending)>,
    pub keys: Vec<PendingKey>,
    pub payloads: Vec<(TaskId, Arc<[u8]>)>,
    pub blocks: Vec<(u64, Arc<[u8]>)>,
    pub worker_events: Vec<(u64, Arc<[u8]>)>,
}

/// Entries of each kind a round settles per hold of the overlay lock: the writer's commits and
/// every reader wait on that lock, and settling a round of 8,000 tasks at once held it for
/// 3.5-5.9 ms (measured during `sluice bench e2e`, the materializer running at nice 10).
pub const SETTLE_SLICE: usize = 512;

/// Slice `slice` of `items`, empty past their end.
fn part<T>(items: &[T], slice: usize) -> &[T] {
    let start = slice.saturating_mul(SETTLE_SLICE).min(items.len());
    &items[start..(start + SETTLE_SLICE).min(items.len())]
}

impl Round {
    /// How many slices settling this round takes.
    pub fn slices(&self) -> usize {
        [
            self.tasks.len(),
            self.keys.len(),
            self.payloads.len(),
            self.blocks.len(),
            self.worker_events.len(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
        .div_ceil(SETTLE_SLICE)
    }

    /// Each kind in key order: sled then writes neighbouring keys one after another, rather
    /// than a leaf here and a leaf there. (Blocks and worker events come from ordered maps.)
    pub fn into_key_order(mut self) -> Round {
        self.tasks.sort_unstable_by_key(|(id, _)| *id);
        self.keys.sort_unstable();
        self.payloads.sort_unstable_by_key(|(id, _)| *id);
        self
    }
}

impl Overlay {
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
            && self.keys.is_empty()
            && self.payloads.is_empty()
            && self.blocks.is_empty()
            && self.worker_events.is_empty()
    }

    /// Records, keys, payloads and log entries held.
    pub fn len(&self) -> usize {
        self.tasks.len()
            + self.keys.len()
            + self.payloads.len()
            + self.blocks.len()
            + self.worker_events.len()
    }

    /// Takes in commit `commit`. `replayed` says it comes from the log after a crash, when any
    /// state it touched may have been written in place already.
    pub fn absorb(&mut self, commit: u64, entry: Entry, replayed: bool) {
        for write in entry.writes {
            let mut stale = write.previous.map_or(0, state_bit);
            if replayed {
                stale |= write.touched;
            }
            let pending = Pending {
                state: write.state,
                callback: write.callback,
                index_value: write.index_value,
                record: write.record,
                stale_index: stale,
                commit,
            };
            match self.tasks.entry(write.id) {
                std::collections::hash_map::Entry::Occupied(mut entry) => {
                    let held = entry.get_mut();
                    let stale_index = if replayed {
                        held.stale_index | stale | state_bit(held.state)
                    } else {
                        held.stale_index
                    };
                    let callback = match pending.callback {
                        CallbackMark::Keep => held.callback,
                        mark => mark,
                    };
                    *held = Pending {
                        stale_index,
                        callback,
                        ..pending
                    };
                }
                std::collections::hash_map::Entry::Vacant(entry) => {
                    entry.insert(pending);
                }
            }
        }
        self.keys.extend(entry.keys);
        self.payloads.extend(entry.payloads);
        self.blocks.extend(entry.blocks);
        self.worker_events.extend(entry.worker_events);
        self.last_commit = self.last_commit.max(commit);
        if self.pending_since.is_none() && !self.is_empty() {
            self.pending_since = Some(Instant::now());
        }
    }

    /// Everything held, as it is now. Taken under the overlay's lock, which the writer's
    /// commits wait on, so it only copies: `Round::into_key_order` sorts, after the lock.
    pub fn round(&self) -> Round {
        Round {
            through_commit: self.last_commit,
            tasks: self
                .tasks
                .iter()
                .map(|(id, pending)| (*id, pending.clone()))
                .collect(),
            keys: self
                .keys
                .iter()
                .map(|(key, record)| (key.clone(), *record))
                .collect(),
            payloads: self
                .payloads
                .iter()
                .map(|(id, bytes)| (*id, bytes.clone()))
                .collect(),
            blocks: self
                .blocks
                .iter()
                .map(|(seq, bytes)| (*seq, bytes.clone()))
                .collect(),
            worker_events: self
                .worker_events
                .iter()
                .map(|(seq, bytes)| (*seq, bytes.clone()))
                .collect(),
        }
    }

    /// Forgets what `round` wrote in place; a task written again since keeps its newer record,
    /// now over an index entry in the state the round wrote. (The materializer settles slice
    /// by slice instead, to let go of the lock between.)
    #[cfg(test)]
    pub fn settle(&mut self, round: &Round) {
        for slice in 0..round.slices() {
            self.settle_slice(round, slice);
        }
        self.settled();
    }

    /// Settles slice `slice` of `round` (see `SETTLE_SLICE`). Slices may be settled with
    /// commits absorbed between them: what a slice forgets is in sled already, and a task
    /// written again before its slice is kept, as `settle` keeps it.
    pub fn settle_slice(&mut self, round: &Round, slice: usize) {
        for (id, written) in part(&round.tasks, slice) {
            if let Some(held) = self.tasks.get_mut(id) {
                if held.commit == written.commit {
                    self.tasks.remove(id);
                } else {
                    held.stale_index = state_bit(written.state);
                    if held.callback == written.callback {
                        held.callback = CallbackMark::Keep;
                    }
                }
            }
        }
        for (key, _) in part(&round.keys, slice) {
            self.keys.remove(key);
        }
        for (id, _) in part(&round.payloads, slice) {
            self.payloads.remove(id);
        }
        for (seq, _) in part(&round.blocks, slice) {
            self.blocks.remove(seq);
        }
        for (seq, _) in part(&round.worker_events, slice) {
            self.worker_events.remove(seq);
        }
    }

    /// After a round's last slice: restarts the clock of what is still held.
    pub fn settled(&mut self) {
        self.pending_since = if self.is_empty() {
            None
        } else {
            Some(Instant::now())
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::wal::PendingWrite;

    fn entry(writes: Vec<PendingWrite>, keys: Vec<PendingKey>) -> Entry {
        Entry {
            writes,
            keys,
            ..Entry::default()
        }
    }

    fn write(id: u128, previous: Option<State>, state: State, record: &str) -> PendingWrite {
        PendingWrite {
            id: TaskId::from_u128(id),
            previous,
            touched: state_bit(state),
            state,
            callback: CallbackMark::Keep,
            index_value: vec![],
            record: Arc::from(record.as_bytes()),
        }
    }

    #[test]
    fn a_round_settles_what_it_wrote_and_keeps_what_changed_since() {
        let mut overlay = Overlay::default();
        let (a, b) = (TaskId::from_u128(1), TaskId::from_u128(2));
        overlay.absorb(
            1,
            entry(
                vec![
                    write(1, None, State::Queued, "a1"),
                    write(2, Some(State::Queued), State::Claimed, "b1"),
                ],
                vec![("k".into(), [0; 48])],
            ),
            false,
        );
        let round = overlay.round();
        assert_eq!(round.through_commit, 1);
        overlay.absorb(
            2,
            entry(
                vec![write(2, Some(State::Claimed), State::Completed, "b2")],
                vec![],
            ),
            false,
        );
        // `b` keeps the index entry it had before commit 1 until a round writes it.
        assert_eq!(overlay.tasks[&b].stale_index, state_bit(State::Queued));
        overlay.settle(&round);
        assert!(!overlay.tasks.contains_key(&a));
        assert!(overlay.keys.is_empty());
        let held = &overlay.tasks[&b];
        assert_eq!(
            (&held.record[..], held.state),
            (&b"b2"[..], State::Completed)
        );
        assert_eq!(held.stale_index, state_bit(State::Claimed));
    }

    #[test]
    fn settling_slice_by_slice_with_commits_between_keeps_exactly_what_changed_since() {
        let mut overlay = Overlay::default();
        let n = SETTLE_SLICE as u128 + 10;
        let writes = (0..n)
            .map(|id| write(id, None, State::Queued, "first"))
            .collect();
        let keys = (0..n).map(|id| (format!("key-{id}"), [0; 48])).collect();
        overlay.absorb(1, entry(writes, keys), false);
        let round = overlay.round().into_key_order();
        assert_eq!(round.slices(), 2);
        overlay.settle_slice(&round, 0);
        // Between the slices the writer commits: task 0 (settled already) and the last task
        // (not yet) are claimed.
        let last = n - 1;
        overlay.absorb(
            2,
            entry(
                vec![
                    write(0, Some(State::Queued), State::Claimed, "again"),
                    write(last, Some(State::Queued), State::Claimed, "again"),
                ],
                vec![],
            ),
            false,
        );
        overlay.settle_slice(&round, 1);
        overlay.settled();
        let mut held: Vec<u128> = overlay.tasks.keys().map(|id| id.as_u128()).collect();
        held.sort_unstable();
        assert_eq!(held, [0, last]);
        assert!(overlay.keys.is_empty());
        for id in [0, last] {
            let task = &overlay.tasks[&TaskId::from_u128(id)];
            assert_eq!(
                (&task.record[..], task.state),
                (&b"again"[..], State::Claimed)
            );
            // Either way the tree now holds the queued index entry the round wrote.
            assert_eq!(task.stale_index, state_bit(State::Queued), "task {id}");
        }
        assert!(overlay.pending_since.is_some());
    }

    #[test]
    fn replayed_writes_remember_every_state_they_may_have_left_behind() {
        let mut overlay = Overlay::default();
        overlay.absorb(
            4,
            entry(
                vec![write(1, Some(State::Queued), State::Claimed, "1")],
                vec![],
            ),
            true,
        );
        overlay.absorb(
            5,
            entry(
                vec![write(1, Some(State::Claimed), State::Running, "2")],
                vec![],
            ),
            true,
        );
        let held = &overlay.tasks[&TaskId::from_u128(1)];
        assert_eq!(
            held.stale_index,
            state_bit(State::Queued) | state_bit(State::Claimed) | state_bit(State::Running)
        );
        assert_eq!(overlay.last_commit, 5);
    }
}
