//! Free space on the data directory's filesystem, and the reserve the store keeps there.
//!
//! sled treats any I/O error as fatal to the open database (it keeps a global error that every
//! later operation returns), so it must never meet ENOSPC: the store stops taking commits once
//! free space falls under `min_free_disk_bytes`, which leaves sled room to write in place what
//! the log already holds. Commits are refused with `StoreError::Full` (507 at the API) and taken
//! again by themselves once space is freed; nothing is poisoned and no restart is needed.

use sluice_store::StoreError;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a reading of free space is trusted while far from the reserve. Bytes appended since
/// are subtracted from it, so a burst cannot run past the reserve between readings.
const READING_TTL: Duration = Duration::from_millis(100);
/// Closer than this to the reserve, every check reads the filesystem again.
const NEAR_RESERVE_BYTES: u64 = 64 << 20;

pub(super) struct DiskSpace {
    dir: PathBuf,
    min_free_bytes: u64,
    reading: Mutex<Option<Reading>>,
}

#[derive(Clone, Copy)]
struct Reading {
    at: Instant,
    free_bytes: u64,
    written_since: u64,
}

impl DiskSpace {
    pub(super) fn new(dir: &Path, min_free_bytes: u64) -> DiskSpace {
        DiskSpace {
            dir: dir.to_owned(),
            min_free_bytes,
            reading: Mutex::new(None),
        }
    }

    pub(super) fn min_free_bytes(&self) -> u64 {
        self.min_free_bytes
    }

    /// Bytes an unprivileged writer may still use on the filesystem, as of now.
    pub(super) fn free_bytes_now(&self) -> Result<u64, StoreError> {
        let stat = rustix::fs::statvfs(&self.dir).map_err(std::io::Error::from)?;
        let free_bytes = stat.f_bavail.saturating_mul(stat.f_frsize);
        *super::util::lock(&self.reading) = Some(Reading {
            at: Instant::now(),
            free_bytes,
            written_since: 0,
        });
        Ok(free_bytes)
    }

    /// Free bytes, from a recent reading less what was written since, or read afresh.
    pub(super) fn free_bytes(&self) -> Result<u64, StoreError> {
        let reading = *super::util::lock(&self.reading);
        if let Some(reading) = reading {
            let estimate = reading.free_bytes.saturating_sub(reading.written_since);
            let near = estimate < self.min_free_bytes.saturating_add(NEAR_RESERVE_BYTES);
            if !near && reading.at.elapsed() < READING_TTL {
                return Ok(estimate);
            }
        }
        self.free_bytes_now()
    }

    /// Counts bytes just written against the last reading.
    pub(super) fn wrote(&self, bytes: u64) {
        if let Some(reading) = super::util::lock(&self.reading).as_mut() {
            reading.written_since = reading.written_since.saturating_add(bytes);
        }
    }

    /// `Full` when writing `bytes` more would leave less than the reserve.
    pub(super) fn check(&self, bytes: u64) -> Result<(), StoreError> {
        let free_bytes = self.free_bytes()?;
        if free_bytes.saturating_sub(bytes) < self.min_free_bytes {
            return Err(self.full(free_bytes));
        }
        Ok(())
    }

    /// Whether the filesystem holds `bytes` more than half the reserve: the materializer's test,
    /// so that sled can still write in place what was logged just above the reserve.
    pub(super) fn room_for_sled(&self, bytes: u64) -> Result<bool, StoreError> {
        Ok(self.free_bytes_now()? >= bytes.saturating_add(self.min_free_bytes / 2))
    }

    pub(super) fn full(&self, free_bytes: u64) -> StoreError {
        StoreError::Full {
            free_bytes,
            min_free_bytes: self.min_free_bytes,
        }
    }
}
