//! Idempotency keys read ahead for the writer on a store across the network: one read for the
//! keys of the submissions the next group will plan, instead of a round trip per submission in
//! the middle of planning. The read runs on a thread of its own, so the writer plans the
//! worker traffic waiting meanwhile instead of waiting for the database.
//!
//! A read is valid for the writer because the writer is the only one that adds keys: a key the
//! read cannot show was planned by this writer, and is in the group being planned, in a group
//! still in flight, or in one that landed after the read began, which `PendingKeys::landed`
//! is told of.

use super::Command;
use sluice_engine::Input;
use sluice_model::KeyRecord;
use sluice_store::{Store, StoreError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;

type Found = Result<HashMap<String, KeyRecord>, StoreError>;

/// What a read ahead says of the keys of the submissions it covers.
#[derive(Debug, Default)]
pub(super) struct Keys {
    /// Every key asked for: one not in `found` (nor `landed`) has no record.
    read: HashSet<String>,
    found: HashMap<String, KeyRecord>,
    /// Keys of groups that landed after the read began: the read may not show them.
    landed: HashMap<String, KeyRecord>,
    /// How many submissions, from the front of the line, the read covers; a group plans no
    /// others (their keys would be read one round trip each). `usize::MAX` when nothing is
    /// read ahead: on an embedded store, or after a read failed.
    pub(super) covered_submissions: usize,
}

impl Keys {
    /// Nothing read ahead: every key is read when its submission is planned.
    pub(super) fn none() -> Keys {
        Keys {
            covered_submissions: usize::MAX,
            ..Keys::default()
        }
    }

    /// The record of `key` as the read saw it (with what landed since), or `None` when the
    /// read did not ask for it.
    pub(super) fn lookup(&self, key: &str) -> Option<Option<KeyRecord>> {
        if let Some(record) = self.landed.get(key) {
            return Some(Some(*record));
        }
        self.read
            .contains(key)
            .then(|| self.found.get(key).copied())
    }
}

/// A read begun and not yet taken.
pub(super) struct PendingKeys {
    keys: Keys,
    answer: Option<Receiver<Found>>,
}

impl PendingKeys {
    /// Whether taking it now would wait for the database.
    pub(super) fn is_waiting(&self) -> bool {
        self.answer.is_some()
    }

    /// A group that added `keys` landed (committed) after the read began.
    pub(super) fn landed(&mut self, keys: impl IntoIterator<Item = (String, KeyRecord)>) {
        self.keys.landed.extend(keys);
    }

    /// The read's result, waiting for it if need be. A read that failed covers nothing: its
    /// keys are read one by one as their submissions are planned.
    pub(super) fn take(mut self) -> Keys {
        let Some(answer) = self.answer.take() else {
            return self.keys;
        };
        match answer.recv() {
            Ok(Ok(found)) => Keys { found, ..self.keys },
            Ok(Err(error)) => {
                tracing::warn!(%error, "cannot read a group's keys ahead");
                Keys::none()
            }
            Err(_) => {
                tracing::warn!("the key reader has stopped; keys are read as they are planned");
                Keys::none()
            }
        }
    }
}

struct Request {
    keys: Vec<String>,
    answer: SyncSender<Found>,
}

/// The thread that reads keys ahead.
pub(super) struct KeyReader {
    requests: Option<SyncSender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl KeyReader {
    pub(super) fn start(store: Arc<dyn Store>) -> std::io::Result<KeyReader> {
        // The writer has at most one read pending.
        let (requests, inbox) = std::sync::mpsc::sync_channel::<Request>(1);
        let thread = std::thread::Builder::new()
            .name("sluice-key-reader".into())
            .spawn(move || {
                while let Ok(request) = inbox.recv() {
                    let wanted: Vec<&str> = request.keys.iter().map(String::as_str).collect();
                    // The writer may have dropped the read (after a failed commit).
                    let _ = request.answer.send(store.keys(&wanted));
                }
            })?;
        Ok(KeyReader {
            requests: Some(requests),
            thread: Some(thread),
        })
    }

    /// Begins the read of the keys of the submissions at the front of `others` that one group
    /// can take (up to `max_tasks` tasks, a batch whole); `None` when none is waiting.
    pub(super) fn read_ahead<'a>(
        &self,
        others: impl IntoIterator<Item = &'a Command>,
        max_tasks: usize,
    ) -> Option<PendingKeys> {
        let mut wanted: Vec<String> = Vec::new();
        let (mut tasks, mut submissions) = (0, 0);
        for command in others {
            if tasks >= max_tasks {
                break;
            }
            if let Command::Step {
                input: Input::Submit(batch),
                ..
            } = command
            {
                tasks += batch.len();
                submissions += 1;
                wanted.extend(batch.iter().filter_map(|s| s.spec.key.clone()));
            }
        }
        if submissions == 0 {
            return None;
        }
        let keys = Keys {
            read: wanted.iter().cloned().collect(),
            covered_submissions: submissions,
            ..Keys::default()
        };
        if wanted.is_empty() {
            return Some(PendingKeys { keys, answer: None });
        }
        let (answer_tx, answer) = std::sync::mpsc::sync_channel(1);
        let sent = self.requests.as_ref().is_some_and(|requests| {
            requests
                .send(Request {
                    keys: wanted,
                    answer: answer_tx,
                })
                .is_ok()
        });
        Some(match sent {
            true => PendingKeys {
                keys,
                answer: Some(answer),
            },
            // The thread is gone (it never panics on its own): read as planned.
            false => PendingKeys {
                keys: Keys::none(),
                answer: None,
            },
        })
    }

    pub(super) fn finish(mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the key reader thread panicked");
        }
    }
}
