//! What is committed (in the write-ahead log) but not yet written into sled: each task's latest
//! record and the index entries that still point at an older state, new idempotency keys, large
//! payloads, event blocks and worker log entries. Readers look here first; the materializer
//! drains it.
//!
//! It holds two generations: the one commits go into, and the one a materializer round is
//! writing into sled. A round takes the first whole and leaves an empty one in its place, and
//! forgets it whole once sled has it, so the overlay's lock (which every commit and reader
//! waits on) is never held for work that grows with the number of tasks. Readers look in the
//! newer generation, then the older.

use super::wal::{CallbackMark, Entry, state_bit};
use sluice_model::{State, TaskId, TaskIdMap};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct PendingTask {
    pub state: State,
    pub callback: CallbackMark,
    pub index_value: Vec<u8>,
    pub record: Arc<[u8]>,
    /// States whose index entry for this task may be in the tree: the one materialized last,
    /// or after a crash every state the replayed log touched.
    pub stale_index: u16,
}

/// One generation of pending writes.
#[derive(Debug, Default)]
pub struct Generation {
    pub tasks: TaskIdMap<PendingTask>,
    pub keys: HashMap<String, [u8; 48]>,
    pub payloads: TaskIdMap<Arc<[u8]>>,
    /// Event log blocks by first `seq`.
    pub blocks: BTreeMap<u64, Arc<[u8]>>,
    /// Worker log entries by `seq`.
    pub worker_events: BTreeMap<u64, Arc<[u8]>>,
    /// The bytes of everything above, as records, payloads and blocks add up.
    pub bytes: usize,
}

impl Generation {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records, keys, payloads and log entries held.
    pub fn len(&self) -> usize {
        self.tasks.len()
            + self.keys.len()
            + self.payloads.len()
            + self.blocks.len()
            + self.worker_events.len()
    }
}

#[derive(Default)]
pub struct Overlay {
    /// Where commits go.
    current: Generation,
    /// What the round under way is writing into sled (empty when none is): still read, after
    /// `current`, until the round settles. A round that failed leaves it here to be retried.
    writing: Arc<Generation>,
    /// The last commit in `writing`.
    writing_through: u64,
    /// The last commit held.
    last_commit: u64,
    /// When the oldest write in `current` arrived.
    pub pending_since: Option<Instant>,
}

/// What one materializer round writes in place: a generation, taken whole.
pub struct Round {
    pub through_commit: u64,
    pub writes: Arc<Generation>,
}

impl Overlay {
    /// Records, keys, payloads and log entries in the generation commits go into.
    pub fn len(&self) -> usize {
        self.current.len()
    }

    /// Tasks held in both generations (one that is in both counts twice): what a bound on
    /// pending work counts.
    pub fn task_count(&self) -> usize {
        self.current.tasks.len() + self.writing.tasks.len()
    }

    /// The bytes held in both generations: what bounds the overlay's memory, since one task's
    /// record and payload may each be a mebibyte.
    pub fn byte_count(&self) -> usize {
        self.current.bytes + self.writing.bytes
    }

    /// Whether the generation of a round that failed waits to be written again (asked between
    /// rounds, by the materializer).
    pub fn round_due(&self) -> bool {
        !self.writing.is_empty()
    }

    pub fn task(&self, id: &TaskId) -> Option<&PendingTask> {
        self.current
            .tasks
            .get(id)
            .or_else(|| self.writing.tasks.get(id))
    }

    pub fn key(&self, key: &str) -> Option<&[u8; 48]> {
        self.current
            .keys
            .get(key)
            .or_else(|| self.writing.keys.get(key))
    }

    pub fn payload(&self, id: &TaskId) -> Option<&Arc<[u8]>> {
        self.current
            .payloads
            .get(id)
            .or_else(|| self.writing.payloads.get(id))
    }

    /// Every task held, the newer generation's entry where both hold one.
    pub fn tasks(&self) -> impl Iterator<Item = (&TaskId, &PendingTask)> {
        let older = self
            .writing
            .tasks
            .iter()
            .filter(|(id, _)| !self.current.tasks.contains_key(id));
        self.current.tasks.iter().chain(older)
    }

    /// The block holding event `seq` (the last starting at or before it), if held here.
    /// Every block of `writing` comes before every block of `current`: commits number them
    /// in order, and a round takes all of `current`.
    pub fn block_holding(&self, seq: u64) -> Option<&Arc<[u8]>> {
        self.current
            .blocks
            .range(..=seq)
            .next_back()
            .or_else(|| self.writing.blocks.range(..=seq).next_back())
            .map(|(_, bytes)| bytes)
    }

    /// The blocks starting after `seq`, in order.
    pub fn blocks_after(&self, seq: u64) -> impl Iterator<Item = &Arc<[u8]>> {
        let after = seq.saturating_add(1)..;
        self.writing
            .blocks
            .range(after.clone())
            .chain(self.current.blocks.range(after))
            .map(|(_, bytes)| bytes)
    }

    /// Worker log entries from `first` on, in order.
    pub fn worker_events_from(&self, first: u64) -> impl Iterator<Item = (&u64, &Arc<[u8]>)> {
        self.writing
            .worker_events
            .range(first..)
            .chain(self.current.worker_events.range(first..))
    }

    /// Takes in commit `commit`. `replayed` says it comes from the log after a crash, when any
    /// state it touched may have been written in place already.
    ///
    /// A task the round under way is writing is entered afresh: its index entries to remove
    /// are then those of the state before this commit, which is the state that round leaves
    /// in sled (rounds run one after another).
    pub fn absorb(&mut self, commit: u64, entry: Entry, replayed: bool) {
        for write in entry.writes {
            let mut stale = write.previous.map_or(0, state_bit);
            if replayed {
                stale |= write.touched;
            }
            let pending = PendingTask {
                state: write.state,
                callback: write.callback,
                index_value: write.index_value,
                record: write.record,
                stale_index: stale,
            };
            self.current.bytes += pending.record.len() + pending.index_value.len();
            match self.current.tasks.entry(write.id) {
                std::collections::hash_map::Entry::Occupied(mut entry) => {
                    let held = entry.get_mut();
                    self.current.bytes = self
                        .current
                        .bytes
                        .saturating_sub(held.record.len() + held.index_value.len());
                    let stale_index = if replayed {
                        held.stale_index | stale | state_bit(held.state)
                    } else {
                        held.stale_index
                    };
                    let callback = match pending.callback {
                        CallbackMark::Keep => held.callback,
                        mark => mark,
                    };
                    *held = PendingTask {
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
        self.current.bytes += entry.keys.len() * 64
            + entry.payloads.iter().map(|(_, p)| p.len()).sum::<usize>()
            + entry.blocks.iter().map(|(_, b)| b.len()).sum::<usize>()
            + entry
                .worker_events
                .iter()
                .map(|(_, e)| e.len())
                .sum::<usize>();
        self.current.keys.extend(entry.keys);
        self.current.payloads.extend(entry.payloads);
        self.current.blocks.extend(entry.blocks);
        self.current.worker_events.extend(entry.worker_events);
        self.last_commit = self.last_commit.max(commit);
        if self.pending_since.is_none() && !self.current.is_empty() {
            self.pending_since = Some(Instant::now());
        }
    }

    /// The next round: the generation of a round that failed, to be written again, or else
    /// everything committed since the last round, taken whole (an empty generation takes
    /// its place).
    pub fn take_round(&mut self) -> Round {
        if self.writing.is_empty() {
            self.writing = Arc::new(std::mem::take(&mut self.current));
            self.writing_through = self.last_commit;
            self.pending_since = None;
        }
        Round {
            through_commit: self.writing_through,
            writes: self.writing.clone(),
        }
    }

    /// Forgets `round`, which sled now holds. Its generation is freed by whoever drops the
    /// last handle on it: the materializer, after letting go of the lock.
    pub fn settle(&mut self, round: &Round) {
        if Arc::ptr_eq(&self.writing, &round.writes) {
            self.writing = Arc::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wal::{PendingKey, PendingWrite};

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

    fn held(overlay: &Overlay, id: u128) -> (&[u8], State, u16) {
        let task = overlay.task(&TaskId::from_u128(id)).expect("held");
        (&task.record[..], task.state, task.stale_index)
    }

    #[test]
    fn a_round_takes_what_was_committed_and_reads_see_it_until_it_settles() {
        let mut overlay = Overlay::default();
        overlay.absorb(
            1,
            entry(
                vec![
                    write(1, None, State::Queued, "a1"),
                    write(2, Some(State::Queued), State::Claimed, "b1"),
                ],
                vec![("k".into(), [7; 48])],
            ),
            false,
        );
        let round = overlay.take_round();
        assert_eq!(round.through_commit, 1);
        assert_eq!(round.writes.tasks.len(), 2);
        assert_eq!(overlay.len(), 0);
        assert!(overlay.pending_since.is_none());
        // While the round writes, commit 2 moves `b` on.
        overlay.absorb(
            2,
            entry(
                vec![write(2, Some(State::Claimed), State::Completed, "b2")],
                vec![],
            ),
            false,
        );
        assert!(overlay.pending_since.is_some());
        assert_eq!(held(&overlay, 1), (&b"a1"[..], State::Queued, 0));
        // The round leaves `b` claimed in sled; that index entry is the one to remove next.
        let claimed = state_bit(State::Claimed);
        assert_eq!(held(&overlay, 2), (&b"b2"[..], State::Completed, claimed));
        assert_eq!(overlay.key("k"), Some(&[7; 48]));
        assert_eq!(overlay.tasks().count(), 2);
        assert_eq!(overlay.task_count(), 3);

        overlay.settle(&round);
        assert!(overlay.task(&TaskId::from_u128(1)).is_none());
        assert_eq!(overlay.key("k"), None);
        assert_eq!(held(&overlay, 2), (&b"b2"[..], State::Completed, claimed));
        let next = overlay.take_round();
        assert_eq!(next.through_commit, 2);
        assert_eq!(next.writes.tasks.len(), 1);
    }

    #[test]
    fn a_round_that_failed_is_taken_again_before_anything_newer() {
        let mut overlay = Overlay::default();
        overlay.absorb(
            1,
            entry(vec![write(1, None, State::Queued, "a")], vec![]),
            false,
        );
        let failed = overlay.take_round();
        overlay.absorb(
            2,
            entry(vec![write(2, None, State::Queued, "b")], vec![]),
            false,
        );
        assert!(overlay.round_due());
        let again = overlay.take_round();
        assert!(Arc::ptr_eq(&failed.writes, &again.writes));
        assert_eq!(again.through_commit, 1);
        overlay.settle(&again);
        assert!(!overlay.round_due());
        let next = overlay.take_round();
        assert_eq!(next.through_commit, 2);
        assert!(next.writes.tasks.contains_key(&TaskId::from_u128(2)));
    }

    #[test]
    fn blocks_and_worker_events_read_in_order_across_both_generations() {
        let mut overlay = Overlay::default();
        let block = |seq: u64| (seq, Arc::<[u8]>::from(seq.to_string().as_bytes()));
        let logged = |seqs: &[u64]| Entry {
            blocks: seqs.iter().map(|&s| block(s)).collect(),
            worker_events: seqs.iter().map(|&s| block(s)).collect(),
            ..Entry::default()
        };
        overlay.absorb(1, logged(&[1, 4]), false);
        let _round = overlay.take_round();
        overlay.absorb(2, logged(&[7, 9]), false);
        let text = |bytes: &Arc<[u8]>| String::from_utf8(bytes.to_vec()).unwrap();
        assert_eq!(overlay.block_holding(5).map(text).as_deref(), Some("4"));
        assert_eq!(overlay.block_holding(8).map(text).as_deref(), Some("7"));
        assert_eq!(overlay.block_holding(0), None);
        let after: Vec<String> = overlay.blocks_after(3).map(text).collect();
        assert_eq!(after, ["4", "7", "9"]);
        let from: Vec<u64> = overlay.worker_events_from(4).map(|(seq, _)| *seq).collect();
        assert_eq!(from, [4, 7, 9]);
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
        let (_, _, stale) = held(&overlay, 1);
        assert_eq!(
            stale,
            state_bit(State::Queued) | state_bit(State::Claimed) | state_bit(State::Running)
        );
        assert_eq!(overlay.take_round().through_commit, 5);
    }

    #[test]
    fn the_bytes_held_follow_what_is_pending_and_a_rewrite_replaces_its_record() {
        let mut overlay = Overlay::default();
        let big = "x".repeat(1 << 20);
        overlay.absorb(
            1,
            entry(vec![write(1, None, State::Queued, &big)], vec![]),
            false,
        );
        assert_eq!(overlay.byte_count(), 1 << 20);
        // The same task written again counts once, at its new size.
        overlay.absorb(
            2,
            entry(
                vec![write(1, Some(State::Queued), State::Claimed, "small")],
                vec![],
            ),
            false,
        );
        assert_eq!(overlay.byte_count(), 5);
        let round = overlay.take_round();
        assert_eq!(overlay.byte_count(), 5, "a round under way is still held");
        overlay.settle(&round);
        assert_eq!(overlay.byte_count(), 0);
    }
}
