//! What the write-ahead log holds and `sluice_tasks` does not yet: each task's latest row since
//! the materializer last wrote it. Readers look here first; the materializer drains it.
//!
//! Two generations, as in the embedded store's overlay: the one commits go into, and the one a
//! round is writing into the table. A round takes the first whole and leaves an empty one in
//! its place, and forgets it once the table has it, so the lock every commit and reader takes
//! is never held for work that grows with the number of tasks. Readers look in the newer
//! generation, then the older.

use super::wal::Row;
use sluice_model::{TaskId, TaskIdMap};
use std::sync::Arc;
use std::time::Instant;

/// One generation of rows waiting to be written.
#[derive(Debug, Default)]
pub(super) struct Generation {
    pub rows: TaskIdMap<Row>,
    /// What `rows` holds, in bytes (`Row::bytes`).
    pub bytes: usize,
    /// The newest write-ahead record whose rows are here: a round that writes this generation
    /// removes the records up to it, whose rows it has then written.
    pub through_wal_id: i64,
}

impl Generation {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Takes in the rows of write-ahead record `wal_id`, each superseding the one held for its
    /// task. A row superseded before it was ever written hands its payload on: the table still
    /// has no row for that task, so the newer one is inserted with it.
    pub fn absorb(&mut self, wal_id: i64, rows: Vec<(TaskId, Row)>) {
        for (id, mut row) in rows {
            match self.rows.entry(id) {
                std::collections::hash_map::Entry::Occupied(mut held) => {
                    let held = held.get_mut();
                    self.bytes = self.bytes.saturating_sub(held.bytes());
                    if row.payload.is_none() {
                        row.payload = held.payload.take();
                    }
                    self.bytes += row.bytes();
                    *held = row;
                }
                std::collections::hash_map::Entry::Vacant(vacant) => {
                    self.bytes += row.bytes();
                    vacant.insert(row);
                }
            }
        }
        debug_assert!(
            wal_id >= self.through_wal_id,
            "records are absorbed in order"
        );
        self.through_wal_id = self.through_wal_id.max(wal_id);
    }
}

#[derive(Default)]
pub(super) struct Overlay {
    /// Where commits go.
    current: Generation,
    /// What the round under way is writing (empty when none is): still read, after `current`,
    /// until the round settles. A round that failed leaves it here to be written again first.
    writing: Arc<Generation>,
    /// When the oldest row in `current` arrived.
    pub pending_since: Option<Instant>,
}

impl Overlay {
    pub fn absorb(&mut self, wal_id: i64, rows: Vec<(TaskId, Row)>) {
        if rows.is_empty() {
            return;
        }
        self.current.absorb(wal_id, rows);
        if self.pending_since.is_none() {
            self.pending_since = Some(Instant::now());
        }
    }

    /// Rows held in both generations (a task in both counts twice).
    pub fn task_count(&self) -> usize {
        self.current.rows.len() + self.writing.rows.len()
    }

    /// Bytes held in both generations: what bounds the overlay's memory.
    pub fn byte_count(&self) -> usize {
        self.current.bytes + self.writing.bytes
    }

    /// Rows in the generation commits go into.
    pub fn current_len(&self) -> usize {
        self.current.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.current.is_empty() && self.writing.is_empty()
    }

    /// Whether the generation of a round that failed waits to be written again.
    pub fn round_due(&self) -> bool {
        !self.writing.is_empty()
    }

    pub fn row(&self, id: &TaskId) -> Option<&Row> {
        self.current
            .rows
            .get(id)
            .or_else(|| self.writing.rows.get(id))
    }

    /// The payload of a task whose row is not in the table yet. (Its newest row may be in
    /// `current` without it, while the round writing the older one inserts it.)
    pub fn payload(&self, id: &TaskId) -> Option<&[u8]> {
        let newer = self
            .current
            .rows
            .get(id)
            .and_then(|row| row.payload.as_deref());
        newer.or_else(|| {
            self.writing
                .rows
                .get(id)
                .and_then(|row| row.payload.as_deref())
        })
    }

    pub fn contains(&self, id: &TaskId) -> bool {
        self.current.rows.contains_key(id) || self.writing.rows.contains_key(id)
    }

    /// Every task held, with its newest row.
    pub fn rows(&self) -> impl Iterator<Item = (&TaskId, &Row)> {
        let older = self
            .writing
            .rows
            .iter()
            .filter(|(id, _)| !self.current.rows.contains_key(id));
        self.current.rows.iter().chain(older)
    }

    /// The next round: the generation of a round that failed, or else everything committed
    /// since the last round, taken whole. `None` when nothing waits.
    pub fn take_round(&mut self) -> Option<Arc<Generation>> {
        if self.writing.is_empty() {
            if self.current.is_empty() {
                return None;
            }
            self.writing = Arc::new(std::mem::take(&mut self.current));
            self.current.through_wal_id = self.writing.through_wal_id;
            self.pending_since = None;
        }
        Some(self.writing.clone())
    }

    /// Forgets `round`, which the table now holds.
    pub fn settle(&mut self, round: &Arc<Generation>) {
        if Arc::ptr_eq(&self.writing, round) {
            self.writing = Arc::default();
        }
    }

    /// Forgets everything: the table holds it all (after a replay of the log).
    pub fn clear(&mut self) {
        *self = Overlay::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(record: &str, payload: Option<&str>) -> Row {
        Row {
            state: 1,
            record: record.as_bytes().to_vec(),
            queue_entry: None,
            key: None,
            callback_pending: false,
            holds_place: false,
            updated_at_ms: 0,
            payload: payload.map(|p| p.as_bytes().to_vec()),
        }
    }

    fn id(n: u128) -> TaskId {
        TaskId::from_u128(n)
    }

    fn record(overlay: &Overlay, n: u128) -> Option<&[u8]> {
        overlay.row(&id(n)).map(|row| row.record.as_slice())
    }

    #[test]
    fn a_task_written_twice_before_a_round_is_inserted_once_with_its_payload() {
        let mut overlay = Overlay::default();
        overlay.absorb(1, vec![(id(1), row("queued", Some("p")))]);
        overlay.absorb(2, vec![(id(1), row("claimed", None))]);
        overlay.absorb(3, vec![(id(1), row("completed", None))]);
        let round = overlay.take_round().unwrap();
        assert_eq!(round.through_wal_id, 3);
        assert_eq!(round.rows.len(), 1);
        let written = &round.rows[&id(1)];
        assert_eq!(written.record, b"completed");
        assert_eq!(written.payload.as_deref(), Some(&b"p"[..]));
        assert_eq!(round.bytes, written.bytes());
    }

    #[test]
    fn reads_see_a_round_until_it_settles_and_newer_rows_first() {
        let mut overlay = Overlay::default();
        overlay.absorb(
            1,
            vec![
                (id(1), row("a1", Some("pa"))),
                (id(2), row("b1", Some("pb"))),
            ],
        );
        let round = overlay.take_round().unwrap();
        assert!(overlay.pending_since.is_none());
        // While the round writes, record 2 moves `b` on: an update, its payload in the round.
        overlay.absorb(2, vec![(id(2), row("b2", None))]);
        assert_eq!(record(&overlay, 1), Some(&b"a1"[..]));
        assert_eq!(record(&overlay, 2), Some(&b"b2"[..]));
        assert_eq!(overlay.payload(&id(2)), Some(&b"pb"[..]));
        assert_eq!(overlay.rows().count(), 2);
        assert_eq!(overlay.task_count(), 3);

        overlay.settle(&round);
        assert_eq!(record(&overlay, 1), None);
        assert_eq!(overlay.payload(&id(2)), None, "the table has it now");
        let next = overlay.take_round().unwrap();
        assert_eq!(next.through_wal_id, 2);
        assert_eq!(next.rows[&id(2)].payload, None, "updated, not inserted");
        overlay.settle(&next);
        assert!(overlay.is_empty() && overlay.take_round().is_none());
    }

    #[test]
    fn a_round_that_failed_is_taken_again_before_anything_newer() {
        let mut overlay = Overlay::default();
        overlay.absorb(1, vec![(id(1), row("a", Some("p")))]);
        let failed = overlay.take_round().unwrap();
        overlay.absorb(2, vec![(id(2), row("b", Some("p")))]);
        assert!(overlay.round_due());
        let again = overlay.take_round().unwrap();
        assert!(Arc::ptr_eq(&failed, &again));
        overlay.settle(&again);
        let next = overlay.take_round().unwrap();
        assert_eq!(next.through_wal_id, 2);
        assert!(next.rows.contains_key(&id(2)) && !next.rows.contains_key(&id(1)));
    }

    #[test]
    fn the_bytes_held_follow_the_newest_row_of_each_task() {
        let mut overlay = Overlay::default();
        let big = "x".repeat(1 << 20);
        overlay.absorb(1, vec![(id(1), row(&big, None))]);
        let small = row("small", None);
        let small_bytes = small.bytes();
        overlay.absorb(2, vec![(id(1), small)]);
        assert_eq!(overlay.byte_count(), small_bytes);
        let round = overlay.take_round().unwrap();
        assert_eq!(
            overlay.byte_count(),
            small_bytes,
            "a round under way is held"
        );
        overlay.settle(&round);
        assert_eq!(overlay.byte_count(), 0);
    }
}
