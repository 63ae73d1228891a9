//! The event log in PostgreSQL: one row per group commit (a block), not one per event. A block
//! holds a run of consecutive `seq`s side by side (`sluice_store::record::event`: format 2, or
//! the JSON of format 1 in blocks written before), with the offset of each, so
//! one event is read by slicing its block and a commit writes one row and one index entry
//! however many events it logs (five a task's life: a row each cost a third of a commit).

use super::{PgStore, corrupt, int8, uint8};
use crate::backend;
use sluice_model::Event;
use sluice_store::StoreError;

/// Blocks one retention pass removes at most.
pub(super) const MAX_BLOCKS_A_PASS: i64 = 1_024;
/// Blocks `events_after` reads in one query; each holds at most a group's events.
const BLOCKS_A_READ: i64 = 16;

/// A commit's events as the block row `sluice_commit` writes (all `None` without events).
#[derive(Default)]
pub(super) struct Block {
    pub first_seq: Option<i64>,
    pub last_seq: Option<i64>,
    pub last_at_ms: Option<i64>,
    /// Where each event starts in `events`, and where the last ends: one more than the events.
    pub offsets: Option<Vec<i32>>,
    pub events: Option<Vec<u8>>,
}

impl Block {
    /// The block of `events`, which are consecutive by `seq` (one writer numbers them).
    pub(super) fn of(events: &[Event]) -> Result<Block, StoreError> {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Ok(Block::default());
        };
        debug_assert!(
            events.windows(2).all(|pair| pair[1].seq == pair[0].seq + 1),
            "a commit's events are numbered without gaps"
        );
        if last.seq - first.seq + 1 != events.len() as u64 {
            return Err(corrupt(
                "commit",
                format!(
                    "events {}..={} are not consecutive ({} of them)",
                    first.seq,
                    last.seq,
                    events.len()
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(events.len() * 160);
        let mut offsets = Vec::with_capacity(events.len() + 1);
        for event in events {
            offsets.push(offset(bytes.len())?);
            sluice_store::record::event::encode_event_into(event, &mut bytes)?;
        }
        offsets.push(offset(bytes.len())?);
        Ok(Block {
            first_seq: Some(int8(first.seq)),
            last_seq: Some(int8(last.seq)),
            last_at_ms: Some(int8(last.at_ms)),
            offsets: Some(offsets),
            events: Some(bytes),
        })
    }
}

fn offset(length: usize) -> Result<i32, StoreError> {
    i32::try_from(length).map_err(|_| corrupt("commit", "a block of events over 2 GiB"))
}

/// One event of a block: format 2 as written now, or the JSON of a block written before.
fn decode(bytes: &[u8]) -> Result<Event, StoreError> {
    sluice_store::record::event::decode_event(bytes)
}

/// The events of one block row after `after_seq`, at most `limit`.
fn events_of_block(
    first_seq: i64,
    offsets: &[i32],
    bytes: &[u8],
    after_seq: u64,
    limit: usize,
    into: &mut Vec<Event>,
) -> Result<(), StoreError> {
    let first_seq = uint8(first_seq, "event log")?;
    let skip = usize::try_from(after_seq.saturating_sub(first_seq.saturating_sub(1)))
        .unwrap_or(usize::MAX);
    for bounds in offsets.windows(2).skip(skip) {
        if into.len() >= limit {
            break;
        }
        let (start, end) = (
            usize::try_from(bounds[0]).unwrap_or(usize::MAX),
            usize::try_from(bounds[1]).unwrap_or(usize::MAX),
        );
        let slice = bytes
            .get(start..end)
            .ok_or_else(|| corrupt("event log", format!("a block from {first_seq} is cut")))?;
        into.push(decode(slice)?);
    }
    Ok(())
}

impl PgStore {
    /// The events numbered `seqs` that the log still holds, in `seq` order: each sliced out of
    /// its block by the database, so only the events travel.
    pub(super) fn events_numbered(&self, seqs: Vec<i64>) -> Result<Vec<Event>, StoreError> {
        let pool = self.pool();
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar(
                "SELECT substring(b.events FROM b.offsets[s.seq - b.first_seq + 1] + 1 \
                 FOR b.offsets[s.seq - b.first_seq + 2] - b.offsets[s.seq - b.first_seq + 1]) \
                 FROM UNNEST($1::int8[]) AS s(seq) \
                 CROSS JOIN LATERAL (SELECT first_seq, offsets, events FROM sluice_event_blocks \
                 WHERE last_seq >= s.seq ORDER BY last_seq LIMIT 1) AS b \
                 WHERE b.first_seq <= s.seq ORDER BY s.seq",
            )
            .bind(seqs)
            .fetch_all(&pool)
            .await
            .map_err(backend)
        })?;
        rows.iter().map(|bytes| decode(bytes)).collect()
    }

    /// The global log after `after_seq`, oldest first, at most `limit`.
    pub(super) fn events_since(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Event>, StoreError> {
        let mut events = Vec::new();
        let mut after = after_seq;
        while events.len() < limit {
            let pool = self.pool();
            let rows: Vec<(i64, i64, Vec<i32>, Vec<u8>)> = self.block(async move {
                sqlx::query_as(
                    "SELECT first_seq, last_seq, offsets, events FROM sluice_event_blocks \
                     WHERE last_seq > $1 ORDER BY last_seq LIMIT $2",
                )
                .bind(int8(after))
                .bind(BLOCKS_A_READ)
                .fetch_all(&pool)
                .await
                .map_err(backend)
            })?;
            let Some(last) = rows.last() else { break };
            after = uint8(last.1, "event log")?;
            let full = rows.len() < BLOCKS_A_READ as usize;
            for (first_seq, _, offsets, bytes) in &rows {
                events_of_block(*first_seq, offsets, bytes, after_seq, limit, &mut events)?;
            }
            if full {
                break;
            }
        }
        Ok(events)
    }

    /// The `seq` of the oldest event held (1 for an empty log).
    pub(super) fn first_event_seq_held(&self) -> Result<u64, StoreError> {
        let pool = self.pool();
        let first: Option<i64> = self.block(async move {
            sqlx::query_scalar("SELECT min(first_seq) FROM sluice_event_blocks")
                .fetch_one(&pool)
                .await
                .map_err(backend)
        })?;
        first.map_or(Ok(1), |seq| uint8(seq, "event log"))
    }
}

/// Retention: removes the oldest blocks whose every event is from before the cutoff (at most
/// `MAX_BLOCKS_A_PASS`), stopping at the first block that is not, and always keeping the newest
/// block (it carries the last `seq` a restart resumes from); how many went.
pub(super) async fn trim(tx: &mut sqlx::PgConnection, cutoff_ms: u64) -> Result<usize, StoreError> {
    let oldest: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT first_seq, last_at_ms FROM sluice_event_blocks ORDER BY first_seq LIMIT $1",
    )
    .bind(MAX_BLOCKS_A_PASS)
    .fetch_all(&mut *tx)
    .await
    .map_err(backend)?;
    let newest: Option<i64> = sqlx::query_scalar("SELECT max(first_seq) FROM sluice_event_blocks")
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
    let removable = oldest
        .iter()
        .take_while(|&&(first_seq, last_at_ms)| {
            Some(first_seq) != newest && last_at_ms < int8(cutoff_ms)
        })
        .count();
    if let Some(&(last_removed, _)) = removable.checked_sub(1).and_then(|i| oldest.get(i)) {
        sqlx::query("DELETE FROM sluice_event_blocks WHERE first_seq <= $1")
            .bind(last_removed)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
    }
    Ok(removable)
}
