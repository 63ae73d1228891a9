//! The writer's cache of the payloads of the tasks it created lately, handed out with the
//! claims that lease them. A task is usually claimed soon after it is submitted; its claim
//! then needs no read of the store for the payload, which on PostgreSQL is a round trip on
//! every claim's path. A payload never changes once written, so an entry is never stale; the
//! cache is bounded in bytes and in entries, oldest out first, and a claim takes its entries.

use sluice_model::{TaskId, TaskIdMap};
use std::collections::VecDeque;

/// Bytes held at most: the payloads, with `ENTRY_OVERHEAD_BYTES` for each entry's bookkeeping.
pub(crate) const MAX_BYTES: usize = 32 << 20;
/// A larger payload is not kept: it is read from the store when claimed (one round trip is
/// small beside moving it), and kept it would push out hundreds of small ones.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 64 << 10;
/// Entries kept at most, counting in the eviction order the ids already taken.
pub(crate) const MAX_ENTRIES: usize = 65_536;
/// What an entry costs beside its payload: the map's slot, the id in the order, the vector.
const ENTRY_OVERHEAD_BYTES: usize = 64;

fn cost(payload: &[u8]) -> usize {
    payload.len() + ENTRY_OVERHEAD_BYTES
}

#[derive(Default)]
pub(crate) struct PayloadCache {
    payloads: TaskIdMap<Vec<u8>>,
    /// Ids in the order they were put, for eviction; some may have been taken since.
    order: VecDeque<TaskId>,
    /// `cost` summed over `payloads`.
    bytes: usize,
}

impl PayloadCache {
    /// Keeps a new task's payload (unless it is larger than `MAX_PAYLOAD_BYTES`), pushing out
    /// the oldest entries past the bounds.
    pub fn put(&mut self, id: TaskId, payload: &[u8]) {
        if payload.len() > MAX_PAYLOAD_BYTES {
            return;
        }
        match self.payloads.insert(id, payload.to_vec()) {
            Some(replaced) => self.bytes -= cost(&replaced),
            None => self.order.push_back(id),
        }
        self.bytes += cost(payload);
        while self.bytes > MAX_BYTES || self.order.len() > MAX_ENTRIES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(evicted) = self.payloads.remove(&oldest) {
                self.bytes -= cost(&evicted);
            }
        }
        debug_assert!(self.bytes <= MAX_BYTES && self.payloads.len() <= self.order.len());
    }

    /// The payload of `id`, if still held; it is held no longer.
    pub fn take(&mut self, id: TaskId) -> Option<Vec<u8>> {
        let payload = self.payloads.remove(&id)?;
        self.bytes -= cost(&payload);
        Some(payload)
    }

    /// Forgets everything: after a failed commit, the tasks of the groups it refused were
    /// never created.
    pub fn clear(&mut self) {
        self.payloads.clear();
        self.order.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> TaskId {
        TaskId::from_u128(n)
    }

    #[test]
    fn a_payload_put_is_taken_once() {
        let mut cache = PayloadCache::default();
        cache.put(id(1), b"{\"n\":1}");
        assert_eq!(cache.take(id(1)).as_deref(), Some(&b"{\"n\":1}"[..]));
        assert_eq!(cache.take(id(1)), None);
        assert_eq!(cache.bytes, 0);
    }

    #[test]
    fn the_oldest_payloads_go_first_once_the_bytes_are_spent() {
        let mut cache = PayloadCache::default();
        let payload = vec![b'x'; MAX_PAYLOAD_BYTES];
        let fits = MAX_BYTES / cost(&payload);
        for n in 0..=fits as u128 {
            cache.put(id(n), &payload);
        }
        assert!(cache.bytes <= MAX_BYTES);
        assert_eq!(cache.take(id(0)), None, "the oldest was pushed out");
        assert_eq!(
            cache.take(id(fits as u128)).map(|p| p.len()),
            Some(payload.len())
        );
        assert_eq!(cache.take(id(1)).map(|p| p.len()), Some(payload.len()));
    }

    #[test]
    fn small_payloads_are_bounded_in_number_and_taken_ids_do_not_keep_room() {
        let mut cache = PayloadCache::default();
        for n in 0..(MAX_ENTRIES as u128 + 10) {
            cache.put(id(n), b"{}");
            if n % 2 == 0 {
                cache.take(id(n));
            }
        }
        assert!(cache.order.len() <= MAX_ENTRIES);
        assert!(cache.payloads.len() <= MAX_ENTRIES / 2 + 5);
        assert_eq!(cache.take(id(1)), None, "pushed out by the count bound");
        assert!(cache.take(id(MAX_ENTRIES as u128 + 9)).is_some());
    }

    #[test]
    fn a_payload_too_large_is_not_kept() {
        let mut cache = PayloadCache::default();
        cache.put(id(1), &vec![b'x'; MAX_PAYLOAD_BYTES + 1]);
        assert_eq!(cache.take(id(1)), None);
        assert_eq!(cache.bytes, 0);
    }
}
