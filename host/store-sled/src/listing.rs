//! Listing tasks in id order: the tree's records (or state index) merged with the overlay. A
//! task the overlay holds is read from there, and the tree's older entry for it is passed over.

use super::keys;
use super::shared::Shared;
use super::util::{corrupt, lock, prefix_end};
use crate::sled_error;
use sluice_model::{Task, TaskId};
use sluice_store::{ListPage, ListQuery, StoreError};
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

pub(super) fn list(shared: &Shared, query: &ListQuery) -> Result<ListPage, StoreError> {
    let (prefix, id_offset): (Vec<u8>, usize) = match query.state {
        Some(state) => (keys::state_prefix(state).to_vec(), 2),
        None => (vec![keys::TASK], 1),
    };
    let start = match query.after {
        Some(after) => {
            let mut key = prefix.clone();
            key.extend_from_slice(&after.to_bytes());
            Bound::Excluded(key)
        }
        None => Bound::Included(prefix.clone()),
    };
    // For each task the overlay holds past `after`: its record when it is in the state asked
    // for, or nothing (so that the tree's stale entry is skipped too).
    let mut pending: Vec<HeldRecord> = lock(&shared.overlay)
        .tasks()
        .filter(|(id, _)| query.after.is_none_or(|after| **id > after))
        .map(|(id, held)| {
            let wanted = query.state.is_none_or(|state| state == held.state);
            (*id, wanted.then(|| held.record.clone()))
        })
        .collect();
    pending.sort_unstable_by_key(|(id, _)| *id);
    let mut merged = Merged {
        shared,
        query,
        id_offset,
        pending: pending.into_iter().peekable(),
        stored: shared
            .tree
            .range::<Vec<u8>, _>((start, Bound::Excluded(prefix_end(&prefix)))),
        head: None,
        last: None,
    };
    let mut page = ListPage::default();
    let mut examined = 0;
    while let Some((id, task)) = merged.next()? {
        examined += 1;
        let wanted = query.kind.as_ref().is_none_or(|k| *k == task.kind)
            && query.device.as_ref().is_none_or(|d| *d == task.device);
        if wanted {
            page.tasks.push(task);
        }
        if page.tasks.len() >= query.limit {
            if merged.next()?.is_some() {
                page.next_after = Some(id);
            }
            break;
        }
        if examined >= query.scan_budget {
            page.next_after = Some(id);
            break;
        }
    }
    Ok(page)
}

/// A task the overlay holds, with its record when it is one the listing wants.
type HeldRecord = (TaskId, Option<Arc<[u8]>>);

struct Merged<'a> {
    shared: &'a Shared,
    query: &'a ListQuery,
    id_offset: usize,
    pending: Peekable<std::vec::IntoIter<HeldRecord>>,
    stored: sled::Iter,
    /// The tree's next entry, read ahead.
    head: Option<(TaskId, sled::IVec)>,
    /// The last id answered: the listing is in strictly rising id order.
    last: Option<TaskId>,
}

impl Merged<'_> {
    /// The next task in id order, each at most once. The tree iterator sees writes made while
    /// it runs, so a task answered from the overlay may reach the tree (flushed) after the
    /// merge has passed it; such an entry, at or below the last id answered, is skipped.
    fn next(&mut self) -> Result<Option<(TaskId, Task)>, StoreError> {
        let next = self.next_merged()?;
        if let Some((id, _)) = &next {
            debug_assert!(self.last.is_none_or(|last| last < *id), "ids rise");
            self.last = Some(*id);
        }
        Ok(next)
    }

    fn next_merged(&mut self) -> Result<Option<(TaskId, Task)>, StoreError> {
        loop {
            if self.head.is_none()
                && let Some(entry) = self.stored.next()
            {
                let (key, value) = entry.map_err(sled_error)?;
                let id = keys::id_at(&key, self.id_offset)
                    .ok_or_else(|| corrupt("task index", "short key"))?;
                if self.last.is_some_and(|last| id <= last) {
                    continue;
                }
                self.head = Some((id, value));
            }
            let from_overlay = match (self.pending.peek(), &self.head) {
                (None, None) => return Ok(None),
                (Some((held, _)), Some((stored, _))) => held <= stored,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            if from_overlay {
                let Some((id, record)) = self.pending.next() else {
                    continue;
                };
                if self.head.as_ref().is_some_and(|(stored, _)| *stored == id) {
                    self.head = None;
                }
                if let Some(record) = record {
                    return Ok(Some((id, Shared::decode_task(&record)?)));
                }
                continue;
            }
            let Some((id, value)) = self.head.take() else {
                continue;
            };
            let Some(state) = self.query.state else {
                return Ok(Some((id, Shared::decode_task(&value)?)));
            };
            let bytes = self
                .shared
                .tree
                .get(keys::task(id))
                .map_err(sled_error)?
                .ok_or_else(|| corrupt("state index", format!("{id} has no record")))?;
            let task = Shared::decode_task(&bytes)?;
            // The materializer may have moved this task on since the overlay was read.
            if task.state == state {
                return Ok(Some((id, task)));
            }
        }
    }
}
