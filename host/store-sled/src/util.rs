//! Small helpers every file of the sled backend uses: the corrupt-record error, key ranges by
//! prefix, and a lock that survives a poisoned mutex.

use sluice_store::StoreError;
use std::sync::MutexGuard;

pub(super) fn corrupt(what: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what,
        detail: detail.to_string(),
    }
}

/// The first key after every key that starts with `prefix`.
pub(super) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// A panic while a lock was held leaves data that is still consistent here (every critical
/// section either finishes its write or writes nothing), so a poisoned lock is taken as is.
pub(super) fn lock<T>(mutex: &std::sync::Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Rounds (and the write-ahead log's spare segments) are background work: on a busy machine the writer, the flusher and the request
/// threads, whose delays clients wait on, go first. (Linux lets a thread set its own nice value;
/// where it fails the thread simply runs at the normal priority.)
pub(super) fn lower_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}
