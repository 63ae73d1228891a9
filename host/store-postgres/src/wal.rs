//! The task rows of one commit as the bytes of one write-ahead record (`sluice_wal.rows`): what
//! a commit sends instead of writing each row, and what a replay after a crash or takeover
//! decodes and writes into `sluice_tasks`.
//!
//! Layout, all integers big-endian: `[version u8 = 1][rows u32]`, then per row `[id 16][state
//! i16][flags u8][updated_at_ms i64][record]` followed by `[queue entry]`, `[key]` and
//! `[payload]` as the flags say, each of those four as `[length u32][bytes]`.

use super::corrupt;
use sluice_model::TaskId;
use sluice_store::StoreError;

const VERSION: u8 = 1;

const CALLBACK_PENDING: u8 = 1;
const HOLDS_PLACE: u8 = 1 << 1;
const HAS_QUEUE_ENTRY: u8 = 1 << 2;
const HAS_KEY: u8 = 1 << 3;
const HAS_PAYLOAD: u8 = 1 << 4;
const KNOWN_FLAGS: u8 = CALLBACK_PENDING | HOLDS_PLACE | HAS_QUEUE_ENTRY | HAS_KEY | HAS_PAYLOAD;

/// A task's row in `sluice_tasks` as a commit leaves it: the columns a state change writes,
/// and the payload while the table has no row for the task yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Row {
    pub state: i16,
    /// The task as JSON.
    pub record: Vec<u8>,
    /// While queued: the queue entry recovery rebuilds the queues from.
    pub queue_entry: Option<Vec<u8>>,
    pub key: Option<String>,
    pub callback_pending: bool,
    pub holds_place: bool,
    pub updated_at_ms: i64,
    /// Present while the row is still to be inserted: written once, with the task.
    pub payload: Option<Vec<u8>>,
}

impl Row {
    /// The bytes this row holds in memory, for the bounds on what waits to be written.
    pub fn bytes(&self) -> usize {
        self.record.len()
            + self.queue_entry.as_ref().map_or(0, Vec::len)
            + self.key.as_ref().map_or(0, String::len)
            + self.payload.as_ref().map_or(0, Vec::len)
            + 64
    }
}

/// Appends the record of `rows` to `out`.
pub(super) fn encode<'a>(
    rows: impl ExactSizeIterator<Item = (TaskId, &'a Row)>,
    out: &mut Vec<u8>,
) -> Result<(), StoreError> {
    out.push(VERSION);
    out.extend_from_slice(&length(rows.len())?.to_be_bytes());
    for (id, row) in rows {
        let mut flags = 0;
        for (set, flag) in [
            (row.callback_pending, CALLBACK_PENDING),
            (row.holds_place, HOLDS_PLACE),
            (row.queue_entry.is_some(), HAS_QUEUE_ENTRY),
            (row.key.is_some(), HAS_KEY),
            (row.payload.is_some(), HAS_PAYLOAD),
        ] {
            if set {
                flags |= flag;
            }
        }
        out.extend_from_slice(&id.to_bytes());
        out.extend_from_slice(&row.state.to_be_bytes());
        out.push(flags);
        out.extend_from_slice(&row.updated_at_ms.to_be_bytes());
        let optional = [
            row.queue_entry.as_deref(),
            row.key.as_deref().map(str::as_bytes),
            row.payload.as_deref(),
        ];
        let parts = std::iter::once(Some(row.record.as_slice())).chain(optional);
        for bytes in parts.flatten() {
            out.extend_from_slice(&length(bytes.len())?.to_be_bytes());
            out.extend_from_slice(bytes);
        }
    }
    Ok(())
}

fn length(n: usize) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| corrupt("write-ahead record", "a part over 4 GiB"))
}

/// The rows of one record, in the order they were written.
pub(super) fn decode(bytes: &[u8]) -> Result<Vec<(TaskId, Row)>, StoreError> {
    let mut input = ByteCursor(bytes);
    let version = input.take(1)?[0];
    if version != VERSION {
        return Err(corrupt(
            "write-ahead record",
            format!("version {version}, this build reads {VERSION}"),
        ));
    }
    let count = input.u32()? as usize;
    // Each row takes at least 31 bytes: a count past that is damage, not a reason to allocate.
    if count > bytes.len() / 31 {
        return Err(corrupt(
            "write-ahead record",
            format!("{count} rows in {} bytes", bytes.len()),
        ));
    }
    let mut rows = Vec::with_capacity(count);
    for _ in 0..count {
        let id: [u8; 16] = input.take(16)?.try_into().map_err(|_| short())?;
        let state = i16::from_be_bytes(input.take(2)?.try_into().map_err(|_| short())?);
        let flags = input.take(1)?[0];
        if flags & !KNOWN_FLAGS != 0 {
            return Err(corrupt(
                "write-ahead record",
                format!("unknown flags {flags:#04x}"),
            ));
        }
        let updated_at_ms = i64::from_be_bytes(input.take(8)?.try_into().map_err(|_| short())?);
        let record = input.part()?;
        let mut optional = |flag: u8| -> Result<Option<Vec<u8>>, StoreError> {
            if flags & flag == 0 {
                return Ok(None);
            }
            input.part().map(Some)
        };
        let queue_entry = optional(HAS_QUEUE_ENTRY)?;
        let key = optional(HAS_KEY)?
            .map(String::from_utf8)
            .transpose()
            .map_err(|_| corrupt("write-ahead record", "a key that is not UTF-8"))?;
        let payload = optional(HAS_PAYLOAD)?;
        rows.push((
            TaskId::from_bytes(id),
            Row {
                state,
                record,
                queue_entry,
                key,
                callback_pending: flags & CALLBACK_PENDING != 0,
                holds_place: flags & HOLDS_PLACE != 0,
                updated_at_ms,
                payload,
            },
        ));
    }
    if !input.0.is_empty() {
        return Err(corrupt(
            "write-ahead record",
            format!("{} bytes past its last row", input.0.len()),
        ));
    }
    Ok(rows)
}

fn short() -> StoreError {
    corrupt("write-ahead record", "cut short")
}

struct ByteCursor<'a>(&'a [u8]);

impl<'a> ByteCursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        if self.0.len() < n {
            return Err(short());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().map_err(|_| short())?,
        ))
    }

    fn part(&mut self) -> Result<Vec<u8>, StoreError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: u8, payload: bool) -> Row {
        Row {
            state: i16::from(n),
            record: format!("{{\"n\":{n}}}").into_bytes(),
            queue_entry: (n % 2 == 0).then(|| vec![n; 3]),
            key: (n % 3 == 0).then(|| format!("key-{n}")),
            callback_pending: n % 4 == 0,
            holds_place: n % 5 == 0,
            updated_at_ms: i64::from(n) * 1_000,
            payload: payload.then(|| vec![b'p'; usize::from(n)]),
        }
    }

    fn encoded(rows: &[(TaskId, Row)]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(rows.iter().map(|(id, row)| (*id, row)), &mut out).unwrap();
        out
    }

    #[test]
    fn rows_read_back_as_they_were_written() {
        let rows: Vec<(TaskId, Row)> = (0..12u8)
            .map(|n| (TaskId::from_u128(u128::from(n) << 70), row(n, n % 2 == 1)))
            .collect();
        assert_eq!(decode(&encoded(&rows)).unwrap(), rows);
        assert!(decode(&encoded(&[])).unwrap().is_empty());
    }

    #[test]
    fn a_damaged_record_is_refused_as_corrupt_not_misread() {
        let bytes = encoded(&[(TaskId::from_u128(1), row(3, true))]);
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut]), Err(StoreError::Corrupt { .. })),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(StoreError::Corrupt { .. })));
        let mut other_version = bytes.clone();
        other_version[0] = 2;
        assert!(matches!(
            decode(&other_version),
            Err(StoreError::Corrupt { detail, .. }) if detail.contains("version 2")
        ));
        let mut unknown_flag = bytes;
        unknown_flag[5 + 16 + 2] |= 0x80;
        assert!(matches!(
            decode(&unknown_flag),
            Err(StoreError::Corrupt { .. })
        ));
        // A count no record of that size could hold.
        let mut huge = vec![VERSION];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(decode(&huge), Err(StoreError::Corrupt { .. })));
    }
}
