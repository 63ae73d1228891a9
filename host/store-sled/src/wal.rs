//! The write-ahead form of a commit: each task's record as the commit leaves it, with what its
//! state index needs, the commit's new idempotency keys, large payloads, its event block and
//! worker log entries, as one record of the write-ahead file (`wal_file`). A commit appends this
//! and the flusher syncs one file; the materializer writes it all into sled later, coalesced,
//! where writing every record and index entry in place cost ten sled keys a task.
//!
//! Layout: `[version: 2]`, then `[writes: u32]` times
//! `[id: 16][previous: u8, 0xFF none][touched: u16][state: u8][callback: u8]
//! [index: u32 + bytes][record: u32 + bytes]`, then `[keys: u32]` times `[key: u32 + bytes][48]`,
//! then `[payloads: u32]` times `[id: 16][bytes: u32 + bytes]`, then `[blocks: u32]` times
//! `[first seq: u64][block JSON: u32 + bytes]`, then the same for worker log entries.
//! Integers are big-endian.

use super::util::corrupt;
use sluice_model::{State, TaskId};
use sluice_store::StoreError;
use std::sync::Arc;

const VERSION: u8 = 2;
const NO_STATE: u8 = 0xFF;

/// What a commit does to a task's completion-callback index entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallbackMark {
    Keep = 0,
    Set = 1,
    Clear = 2,
}

/// One task as a commit leaves it.
#[derive(Clone, Debug)]
pub struct PendingWrite {
    pub id: TaskId,
    /// The state before the commit's first write of this task; none when the commit created it.
    pub previous: Option<State>,
    /// Every state the commit moved the task into, as bits by state code.
    pub touched: u16,
    pub state: State,
    pub callback: CallbackMark,
    /// The state index entry's value.
    pub index_value: Vec<u8>,
    /// The task record (`record::encode`).
    pub record: Arc<[u8]>,
}

/// An idempotency key and its encoded record.
pub type PendingKey = (String, [u8; 48]);

/// Everything one commit writes.
#[derive(Clone, Debug, Default)]
pub struct Entry {
    pub writes: Vec<PendingWrite>,
    pub keys: Vec<PendingKey>,
    /// Payloads too large to ride in their task's record.
    pub payloads: Vec<(TaskId, Arc<[u8]>)>,
    /// Event log blocks by first `seq`, as JSON.
    pub blocks: Vec<(u64, Arc<[u8]>)>,
    /// Worker log entries by `seq`, as JSON.
    pub worker_events: Vec<(u64, Arc<[u8]>)>,
}

impl Entry {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
            && self.keys.is_empty()
            && self.payloads.is_empty()
            && self.blocks.is_empty()
            && self.worker_events.is_empty()
    }
}

pub fn state_bit(state: State) -> u16 {
    1 << state.code()
}

/// The states a bit set names.
pub fn states_in(bits: u16) -> impl Iterator<Item = State> {
    (0..16u8)
        .filter(move |code| bits & (1 << code) != 0)
        .filter_map(State::from_code)
}

fn length(n: usize) -> Result<[u8; 4], StoreError> {
    u32::try_from(n)
        .map(u32::to_be_bytes)
        .map_err(|_| corrupt("write-ahead entry", "a field is over 4 GiB"))
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), StoreError> {
    out.extend_from_slice(&length(bytes.len())?);
    out.extend_from_slice(bytes);
    Ok(())
}

pub fn encode(entry: &Entry, out: &mut Vec<u8>) -> Result<(), StoreError> {
    out.push(VERSION);
    out.extend_from_slice(&length(entry.writes.len())?);
    for write in &entry.writes {
        out.extend_from_slice(&write.id.to_bytes());
        out.push(write.previous.map_or(NO_STATE, State::code));
        out.extend_from_slice(&write.touched.to_be_bytes());
        out.push(write.state.code());
        out.push(write.callback as u8);
        put_bytes(out, &write.index_value)?;
        put_bytes(out, &write.record)?;
    }
    out.extend_from_slice(&length(entry.keys.len())?);
    for (key, record) in &entry.keys {
        put_bytes(out, key.as_bytes())?;
        out.extend_from_slice(record);
    }
    out.extend_from_slice(&length(entry.payloads.len())?);
    for (id, payload) in &entry.payloads {
        out.extend_from_slice(&id.to_bytes());
        put_bytes(out, payload)?;
    }
    for numbered in [&entry.blocks, &entry.worker_events] {
        out.extend_from_slice(&length(numbered.len())?);
        for (seq, bytes) in numbered {
            out.extend_from_slice(&seq.to_be_bytes());
            put_bytes(out, bytes)?;
        }
    }
    Ok(())
}

pub fn decode(bytes: &[u8]) -> Result<Entry, StoreError> {
    let mut reader = Reader { bytes, at: 0 };
    if reader.take(1)? != [VERSION] {
        return Err(corrupt("write-ahead entry", "unknown version"));
    }
    let mut entry = Entry::default();
    for _ in 0..reader.u32()? {
        let id = TaskId::from_bytes(reader.array()?);
        let previous = match reader.take(1)?[0] {
            NO_STATE => None,
            code => Some(reader.state(code)?),
        };
        let touched = u16::from_be_bytes(reader.array()?);
        let state = reader.take(1)?[0];
        let state = reader.state(state)?;
        let callback = match reader.take(1)?[0] {
            0 => CallbackMark::Keep,
            1 => CallbackMark::Set,
            2 => CallbackMark::Clear,
            _ => return Err(corrupt("write-ahead entry", "unknown callback mark")),
        };
        let index_value = reader.bytes()?.to_vec();
        let record = Arc::from(reader.bytes()?);
        entry.writes.push(PendingWrite {
            id,
            previous,
            touched,
            state,
            callback,
            index_value,
            record,
        });
    }
    for _ in 0..reader.u32()? {
        let key = std::str::from_utf8(reader.bytes()?)
            .map_err(|e| corrupt("write-ahead entry", e))?
            .to_owned();
        entry.keys.push((key, reader.array()?));
    }
    for _ in 0..reader.u32()? {
        let id = TaskId::from_bytes(reader.array()?);
        entry.payloads.push((id, Arc::from(reader.bytes()?)));
    }
    for numbered in [&mut entry.blocks, &mut entry.worker_events] {
        for _ in 0..reader.u32()? {
            let seq = u64::from_be_bytes(reader.array()?);
            numbered.push((seq, Arc::from(reader.bytes()?)));
        }
    }
    if reader.at != bytes.len() {
        return Err(corrupt("write-ahead entry", "trailing bytes"));
    }
    Ok(entry)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("write-ahead entry", "truncated"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        self.take(N)?
            .try_into()
            .map_err(|_| corrupt("write-ahead entry", "truncated"))
    }

    fn u32(&mut self) -> Result<usize, StoreError> {
        Ok(u32::from_be_bytes(self.array()?) as usize)
    }

    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.u32()?;
        self.take(n)
    }

    fn state(&self, code: u8) -> Result<State, StoreError> {
        State::from_code(code).ok_or_else(|| corrupt("write-ahead entry", "unknown state code"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_and_a_damaged_one_is_refused() {
        let writes = vec![
            PendingWrite {
                id: TaskId::from_u128(7),
                previous: None,
                touched: state_bit(State::Created) | state_bit(State::Queued),
                state: State::Queued,
                callback: CallbackMark::Keep,
                index_value: vec![1, 2, 3],
                record: Arc::from(&b"record"[..]),
            },
            PendingWrite {
                id: TaskId::from_u128(9),
                previous: Some(State::Claimed),
                touched: state_bit(State::Completed),
                state: State::Completed,
                callback: CallbackMark::Set,
                index_value: vec![],
                record: Arc::from(&b"other"[..]),
            },
        ];
        let entry = Entry {
            writes,
            keys: vec![("exam-1".to_owned(), [5u8; 48])],
            payloads: vec![(TaskId::from_u128(9), Arc::from(&b"{}"[..]))],
            blocks: vec![(3, Arc::from(&b"[]"[..]))],
            worker_events: vec![(1, Arc::from(&b"{}"[..])), (2, Arc::from(&b"{}"[..]))],
        };
        let mut bytes = Vec::new();
        encode(&entry, &mut bytes).unwrap();
        let read = decode(&bytes).unwrap();
        assert_eq!(read.keys, entry.keys);
        assert_eq!(read.payloads, entry.payloads);
        assert_eq!(read.blocks, entry.blocks);
        assert_eq!(read.worker_events, entry.worker_events);
        let read = read.writes;
        assert_eq!(read.len(), 2);
        assert_eq!(read[1].id, TaskId::from_u128(9));
        assert_eq!(read[1].previous, Some(State::Claimed));
        assert_eq!(read[1].callback, CallbackMark::Set);
        assert_eq!(&read[0].record[..], b"record");
        assert_eq!(
            states_in(read[0].touched).collect::<Vec<_>>(),
            [State::Created, State::Queued]
        );
        for cut in [0, 1, 10, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
    }
}
