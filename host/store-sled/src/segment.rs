//! The sled segment size a data directory is opened with: 1 MiB for a new directory, and for
//! one made before that, the size sled recorded in it (sled refuses to open a directory with
//! any other size).
//!
//! The segment is also sled's I/O buffer, and sled's I/O threads write each full buffer with
//! one `pwrite`. On a kernel built without preemption (`PREEMPT_NONE`, as server kernels often
//! are) the copy into the page cache is not interrupted: with 8 MiB segments it held a core for
//! 5–7 ms (`perf sched`), while the writer, the flusher and the request threads waited behind
//! it, and those waits were the slowest claims. With 1 MiB, `sluice bench e2e --rate 10500`
//! went from 97.1–98.0 % to 99.0–99.5 % of claims within 5 ms (four runs each). Pages over a
//! quarter segment become blob files, which the store fsyncs itself (see `shared.rs`).

use std::path::Path;

/// The segment size of a new data directory.
pub(super) const NEW_SEGMENT_BYTES: usize = 1 << 20;

/// The name sled gives its configuration file, and the line in it that holds the size.
const SLED_CONF_FILE: &str = "conf";
const SEGMENT_LINE: &str = "segment_size: ";

/// The segment size to open `dir` with: the one sled recorded there, else the new default. A
/// record that cannot be read gives the default, and sled then says what it expected.
pub(super) fn segment_bytes(dir: &Path) -> usize {
    recorded(dir).unwrap_or(NEW_SEGMENT_BYTES)
}

fn recorded(dir: &Path) -> Option<usize> {
    // The file ends in a binary checksum: read bytes, not a string.
    let bytes = std::fs::read(dir.join(SLED_CONF_FILE)).ok()?;
    String::from_utf8_lossy(&bytes)
        .lines()
        .find_map(|line| line.strip_prefix(SEGMENT_LINE)?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SledOptions, SledStore};
    use sluice_store::Store;

    #[test]
    fn a_new_directory_gets_one_mebibyte_segments() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(segment_bytes(dir.path()), NEW_SEGMENT_BYTES);
        let store = SledStore::open(dir.path(), &SledOptions::default()).unwrap();
        drop(store);
        assert_eq!(recorded(dir.path()), Some(NEW_SEGMENT_BYTES));
    }

    #[test]
    fn a_directory_made_with_eight_mebibyte_segments_opens_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let old = 8 << 20;
        let db = sled::Config::new()
            .path(dir.path())
            .segment_size(old)
            .open()
            .unwrap();
        db.insert(b"k", b"v").unwrap();
        db.flush().unwrap();
        drop(db);
        assert_eq!(segment_bytes(dir.path()), old);
        let store = SledStore::open(dir.path(), &SledOptions::default()).unwrap();
        assert!(store.recover().is_ok());
    }

    #[test]
    fn an_unreadable_record_gives_the_default() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SLED_CONF_FILE), b"segment_size: lots\n").unwrap();
        assert_eq!(segment_bytes(dir.path()), NEW_SEGMENT_BYTES);
    }
}
