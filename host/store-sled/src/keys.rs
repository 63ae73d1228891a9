//! The key layout of the sled tree. Every record a commit touches lives in one tree, under a
//! one-byte prefix per record type, so a commit is one atomic `apply_batch`.

use sluice_model::{State, TaskId};

pub const TASK: u8 = b't';
pub const PAYLOAD: u8 = b'p';
pub const KEY: u8 = b'k';
/// `g | first seq`: a block of the event log.
pub const BLOCK: u8 = b'g';
pub const STATE: u8 = b's';
/// `c | task id`: a terminal task whose completion callback is still to be delivered.
pub const CALLBACK: u8 = b'c';

pub fn callback(id: TaskId) -> [u8; 17] {
    prefixed(CALLBACK, id)
}

/// `F`: the data directory's format (`format.rs`), one byte.
pub const FORMAT: [u8; 1] = [b'F'];

/// `J`: the last commit of the write-ahead log that is in sled; the log up to it is spent.
pub const WAL_FLOOR: [u8; 1] = [b'J'];

/// `w | seq`: an entry of the worker log.
pub const WORKER_EVENT: u8 = b'w';

pub fn worker_event(seq: u64) -> [u8; 9] {
    let mut out = [0; 9];
    out[0] = WORKER_EVENT;
    out[1..].copy_from_slice(&seq.to_be_bytes());
    out
}

pub fn task(id: TaskId) -> [u8; 17] {
    prefixed(TASK, id)
}

pub fn payload(id: TaskId) -> [u8; 17] {
    prefixed(PAYLOAD, id)
}

pub fn idempotency(key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(KEY);
    out.extend_from_slice(key.as_bytes());
    out
}

pub fn block(first_seq: u64) -> [u8; 9] {
    let mut out = [0; 9];
    out[0] = BLOCK;
    out[1..].copy_from_slice(&first_seq.to_be_bytes());
    out
}

/// `s | state | task id`: tasks by state, in id order.
pub fn state(state: State, id: TaskId) -> [u8; 18] {
    let mut out = [0; 18];
    out[0] = STATE;
    out[1] = state.code();
    out[2..].copy_from_slice(&id.to_bytes());
    out
}

pub fn state_prefix(state: State) -> [u8; 2] {
    [STATE, state.code()]
}

pub fn id_at(key: &[u8], offset: usize) -> Option<TaskId> {
    let bytes: [u8; 16] = key.get(offset..offset + 16)?.try_into().ok()?;
    Some(TaskId::from_bytes(bytes))
}

pub fn seq_at(key: &[u8], offset: usize) -> Option<u64> {
    let bytes: [u8; 8] = key.get(offset..offset + 8)?.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

fn prefixed(prefix: u8, id: TaskId) -> [u8; 17] {
    let mut out = [0; 17];
    out[0] = prefix;
    out[1..].copy_from_slice(&id.to_bytes());
    out
}
