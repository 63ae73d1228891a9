//! The write-ahead file: each commit appended as one checksummed record to a segment file in
//! `<data dir>/wal/`, named by the first commit it holds. `sync` is an fdatasync of the segments
//! written since the last one, so a group's durability costs one small append and one sync, not
//! a flush of everything sled has buffered. Segments whose commits are all under the floor
//! (written into sled and synced there) are deleted.
//!
//! Record: `[body length: u32][crc32 of body: u32][commit: u64][entry (wal::encode)]`, big-endian.
//! A crash can tear only the last record of the last segment; opening cuts it off.

use super::StoreError;
use super::materializer::lock;
use super::sled_store::corrupt;
use super::wal::{self, Entry};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A segment is closed and a new one begun past this size.
const SEGMENT_BYTES: u64 = 64 << 20;
const HEADER_BYTES: usize = 8;
/// A record body larger than this is damage, not data (a commit is bounded well below it).
const MAX_BODY_BYTES: usize = 1 << 30;

pub struct WalFile {
    dir: PathBuf,
    segments: Mutex<Segments>,
}

struct Segments {
    current: Arc<File>,
    current_first: u64,
    current_bytes: u64,
    /// Closed segments, oldest first, by first commit.
    closed: Vec<(u64, PathBuf)>,
    /// Segments written to since the last sync, the current one included.
    unsynced: Vec<Arc<File>>,
    /// A segment was created since the last sync: the directory needs one too.
    directory_changed: bool,
    buffer: Vec<u8>,
}

fn segment_path(dir: &Path, first_commit: u64) -> PathBuf {
    dir.join(format!("{first_commit:020}.wal"))
}

impl WalFile {
    /// Opens the log under `dir`, returning every intact commit in it, oldest first, and
    /// begins a new segment after them.
    pub fn open(dir: &Path) -> Result<(WalFile, Vec<(u64, Entry)>), StoreError> {
        std::fs::create_dir_all(dir)?;
        let mut found: Vec<(u64, PathBuf)> = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let path = item?.path();
            let first = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_suffix(".wal"))
                .and_then(|stem| stem.parse::<u64>().ok());
            if let Some(first) = first {
                found.push((first, path));
            }
        }
        found.sort();
        let mut entries = Vec::new();
        for (index, (_, path)) in found.iter().enumerate() {
            let last = index + 1 == found.len();
            read_segment(path, last, &mut entries)?;
        }
        let next = entries
            .last()
            .map_or(found.last().map_or(1, |(first, _)| *first), |(c, _)| c + 1);
        let (current, current_first) = (create_segment(dir, next)?, next);
        let wal = WalFile {
            dir: dir.to_owned(),
            segments: Mutex::new(Segments {
                current: Arc::new(current),
                current_first,
                current_bytes: 0,
                closed: found
                    .into_iter()
                    .filter(|(first, _)| *first != current_first)
                    .collect(),
                unsynced: Vec::new(),
                directory_changed: true,
                buffer: Vec::new(),
            }),
        };
        Ok((wal, entries))
    }

    /// Appends commit `commit`; durable after the next `sync`.
    pub fn append(&self, commit: u64, entry: &Entry) -> Result<(), StoreError> {
        let mut segments = lock(&self.segments);
        let segments = &mut *segments;
        let buffer = &mut segments.buffer;
        buffer.clear();
        buffer.extend_from_slice(&[0; HEADER_BYTES]);
        buffer.extend_from_slice(&commit.to_be_bytes());
        wal::encode(entry, buffer)?;
        let body = &buffer[HEADER_BYTES..];
        let length = u32::try_from(body.len())
            .ok()
            .filter(|&n| (n as usize) < MAX_BODY_BYTES)
            .ok_or_else(|| corrupt("write-ahead log", "a commit is over 1 GiB"))?;
        let crc = crc32fast::hash(body);
        buffer[..4].copy_from_slice(&length.to_be_bytes());
        buffer[4..8].copy_from_slice(&crc.to_be_bytes());
        (&*segments.current).write_all(buffer)?;
        segments.current_bytes += buffer.len() as u64;
        if !segments
            .unsynced
            .iter()
            .any(|file| Arc::ptr_eq(file, &segments.current))
        {
            segments.unsynced.push(segments.current.clone());
        }
        if segments.current_bytes >= SEGMENT_BYTES {
            let next = commit + 1;
            let file = create_segment(&self.dir, next)?;
            let finished = segment_path(&self.dir, segments.current_first);
            segments.closed.push((segments.current_first, finished));
            segments.current = Arc::new(file);
            segments.current_first = next;
            segments.current_bytes = 0;
            segments.directory_changed = true;
        }
        Ok(())
    }

    /// Makes every record appended before this call durable.
    pub fn sync(&self) -> Result<(), StoreError> {
        let (files, directory_changed) = {
            let mut segments = lock(&self.segments);
            let changed = std::mem::take(&mut segments.directory_changed);
            (std::mem::take(&mut segments.unsynced), changed)
        };
        // The lock is not held here, so the writer appends while the disk syncs.
        for file in &files {
            file.sync_data()?;
        }
        if directory_changed {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }

    /// Deletes the closed segments whose commits are all at or under `floor`.
    pub fn release(&self, floor: u64) -> Result<(), StoreError> {
        let mut segments = lock(&self.segments);
        let mut spent = 0;
        for index in 0..segments.closed.len() {
            let next_first = segments
                .closed
                .get(index + 1)
                .map_or(segments.current_first, |(first, _)| *first);
            if next_first > floor.saturating_add(1) {
                break;
            }
            spent = index + 1;
        }
        for (_, path) in segments.closed.drain(..spent) {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}

fn create_segment(dir: &Path, first_commit: u64) -> Result<File, StoreError> {
    Ok(OpenOptions::new()
        .create(true)
        .append(true)
        .open(segment_path(dir, first_commit))?)
}

/// Reads a segment's records into `entries`. A torn or damaged tail of the last segment is
/// cut off (a crash mid-append); anywhere else it is corruption.
fn read_segment(
    path: &Path,
    last: bool,
    entries: &mut Vec<(u64, Entry)>,
) -> Result<(), StoreError> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let mut at = 0;
    while at < bytes.len() {
        match record_at(&bytes, at) {
            Some((commit, body, next)) => {
                entries.push((commit, wal::decode(body)?));
                at = next;
            }
            None if last => {
                tracing::warn!(
                    path = %path.display(),
                    offset = at,
                    "cutting off a torn write-ahead record (a crash during an append)"
                );
                OpenOptions::new()
                    .write(true)
                    .open(path)?
                    .set_len(at as u64)?;
                break;
            }
            None => {
                return Err(corrupt(
                    "write-ahead log",
                    format!("{} is damaged at byte {at}", path.display()),
                ));
            }
        }
    }
    Ok(())
}

/// The record at `at`: its commit, its entry's bytes and where the next record starts; none
/// when it is torn or fails its checksum.
fn record_at(bytes: &[u8], at: usize) -> Option<(u64, &[u8], usize)> {
    let header = bytes.get(at..at + HEADER_BYTES)?;
    let length = u32::from_be_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_be_bytes(header[4..].try_into().ok()?);
    let body = bytes.get(at + HEADER_BYTES..at + HEADER_BYTES + length)?;
    if length < 8 || crc32fast::hash(body) != crc {
        return None;
    }
    let commit = u64::from_be_bytes(body[..8].try_into().ok()?);
    Some((commit, &body[8..], at + HEADER_BYTES + length))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8) -> Entry {
        Entry {
            blocks: vec![(u64::from(n), Arc::from(&[n][..]))],
            ..Entry::default()
        }
    }

    #[test]
    fn commits_read_back_in_order_and_a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, found) = WalFile::open(dir.path()).unwrap();
            assert!(found.is_empty());
            for commit in 1..=3 {
                wal.append(commit, &entry(commit as u8)).unwrap();
            }
            wal.sync().unwrap();
        }
        // A crash in the middle of the fourth append.
        let segment = segment_path(dir.path(), 1);
        let mut file = OpenOptions::new().append(true).open(&segment).unwrap();
        file.write_all(&[0, 0, 0, 40, 1, 2]).unwrap();
        drop(file);
        let (wal, found) = WalFile::open(dir.path()).unwrap();
        let commits: Vec<u64> = found.iter().map(|(c, _)| *c).collect();
        assert_eq!(commits, [1, 2, 3]);
        assert_eq!(found[2].1.blocks[0].0, 3);
        wal.append(4, &entry(4)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (wal, found) = WalFile::open(dir.path()).unwrap();
        assert_eq!(
            found.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        // Under floor 3 only the segment holding 1..=3 is spent; 4's stays.
        wal.release(3).unwrap();
        let (_, found) = WalFile::open(dir.path()).unwrap();
        assert_eq!(found.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [4]);
    }

    #[test]
    fn damage_before_the_last_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = WalFile::open(dir.path()).unwrap();
            wal.append(1, &entry(1)).unwrap();
            wal.sync().unwrap();
        }
        {
            let (wal, _) = WalFile::open(dir.path()).unwrap();
            wal.append(2, &entry(2)).unwrap();
            wal.sync().unwrap();
        }
        let mut bytes = std::fs::read(segment_path(dir.path(), 1)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        std::fs::write(segment_path(dir.path(), 1), bytes).unwrap();
        assert!(matches!(
            WalFile::open(dir.path()),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
