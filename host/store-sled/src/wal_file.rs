//! The write-ahead file: each commit appended as one checksummed record to a segment file in
//! `<data dir>/wal/`, named by the first commit it holds. `sync` is an fdatasync of the segments
//! written since the last one, so a group's durability costs one small write and one sync, not
//! a flush of everything sled has buffered. Segments whose commits are all under the floor
//! (written into sled and synced there) are deleted.
//!
//! Segments are written over zeros laid down in advance by a background thread: an fdatasync
//! of blocks already allocated changes no file metadata, so it needs no journal commit (which
//! would also wait for whatever sled has in flight). Measured: sync p50 0.7 → 0.25 ms.
//!
//! Record: `[body length: u32][crc32 of body: u32][commit: u64][entry (wal::encode)]`, big-endian,
//! commits consecutive. A segment's records end at the first zero header. A crash can tear only
//! the records after the last sync; opening zeroes them out.

use super::space::DiskSpace;
use super::util::{corrupt, lock};
use super::wal::{self, Entry};
use sluice_store::StoreError;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

/// A new segment is begun once a record would not fit in this size.
const SEGMENT_BYTES: u64 = 32 << 20;
const HEADER_BYTES: usize = 8;
/// A record body larger than this is damage, not data (a commit is bounded well below it).
const MAX_BODY_BYTES: usize = 1 << 30;
const SPARE_NAME: &str = "spare.tmp";
/// Zeros are laid down a chunk at a time, each synced, so the log's own syncs are never
/// stuck behind a whole segment of them.
const ZERO_CHUNK_BYTES: usize = 1 << 20;
/// Each chunk is written in pieces this large. A kernel without preemption copies one `pwrite`
/// whole before anything else runs on that core: a 1 MiB write of zeros into a new file held
/// one for up to 3.3 ms (`perf sched`), in the way of the writer and the request threads. In
/// four `sluice bench e2e --rate 10500` runs the claim p99 was 4.1–4.9 ms with 128 KiB pieces;
/// with 1 MiB, 6.6–6.8 ms in the two runs where the log rolled onto freshly zeroed segments.
const ZERO_WRITE_BYTES: usize = 128 << 10;

pub struct WalFile {
    dir: PathBuf,
    segments: Mutex<Segments>,
    spare: Arc<Spare>,
    preparer: Option<std::thread::JoinHandle<()>>,
}

struct Segments {
    current: Arc<File>,
    current_first: u64,
    current_bytes: u64,
    /// The current segment was laid down as zeros (a spare); the first one after opening is not.
    current_zeroed: bool,
    next_commit: u64,
    /// Closed segments, oldest first, by first commit.
    closed: Vec<(u64, PathBuf)>,
    /// Segments written to since the last sync, the current one included.
    unsynced: Vec<Arc<File>>,
    /// A segment was created or renamed since the last sync: the directory needs one too.
    directory_changed: bool,
    buffer: Vec<u8>,
}

/// The next segment, zeroed ahead of need by the preparer thread.
#[derive(Default)]
struct Spare {
    state: Mutex<SpareState>,
    changed: Condvar,
}

#[derive(Default)]
struct SpareState {
    ready: Option<File>,
    stop: bool,
}

fn segment_path(dir: &Path, first_commit: u64) -> PathBuf {
    dir.join(format!("{first_commit:020}.wal"))
}

impl WalFile {
    /// Opens the log under `dir`, returning every intact commit in it, oldest first, and
    /// begins a new segment after them and after `floor` (the last commit known elsewhere, whose
    /// segment may be gone).
    pub fn open(
        dir: &Path,
        floor: u64,
        space: Arc<DiskSpace>,
    ) -> Result<(WalFile, Vec<(u64, Entry)>), StoreError> {
        Self::open_with(dir, floor, Some(space), Damage::Refuse, &mut Vec::new())
    }

    /// Cuts the log under `dir` at its first damage — a damaged record that is not a torn tail,
    /// or a gap between segments — so that it opens again; answers what was cut (nothing when
    /// the log was sound). The commits past the cut are lost: copy the folder first.
    pub fn salvage(dir: &Path, floor: u64) -> Result<Vec<String>, StoreError> {
        let mut cuts = Vec::new();
        Self::open_with(dir, floor, None, Damage::Salvage, &mut cuts)?;
        Ok(cuts)
    }

    /// `spares`: the free space a thread laying down zeroed segments ahead must leave; none for
    /// no such thread (tests turn it off to know which file each record lands in).
    fn open_with(
        dir: &Path,
        floor: u64,
        spares: Option<Arc<DiskSpace>>,
        damage: Damage,
        cuts: &mut Vec<String>,
    ) -> Result<(WalFile, Vec<(u64, Entry)>), StoreError> {
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
        let mut kept = Vec::new();
        // Commits past the floor must follow one another from it: a segment that ends early
        // while a later one exists has lost acknowledged commits.
        let mut next_expected = floor + 1;
        let mut cut_after: Option<usize> = None;
        for (index, (first, path)) in found.iter().enumerate() {
            let last = index + 1 == found.len();
            if *first > next_expected {
                let what = format!(
                    "commits {next_expected} to {} are missing: the segment before {} ends early",
                    first - 1,
                    path.display()
                );
                if damage == Damage::Refuse {
                    return Err(corrupt(
                        "write-ahead log",
                        format!("{what}. `sluice repair` cuts the log there, keeping a copy"),
                    ));
                }
                cuts.push(format!(
                    "{what}: {} and later segments removed",
                    path.display()
                ));
                cut_after = Some(index);
                break;
            }
            let before = entries.len();
            let cut = read_segment(path, *first, last, damage, &mut entries)?;
            if let Some((commit, _)) = entries.last() {
                next_expected = next_expected.max(commit + 1);
            }
            if entries.len() == before {
                // Nothing was ever synced in it: a segment begun just before a stop.
                std::fs::remove_file(path)?;
            } else {
                kept.push((*first, path.clone()));
            }
            if let Some(cut) = cut {
                cuts.push(cut);
                cut_after = Some(index + 1);
                break;
            }
        }
        if let Some(from) = cut_after {
            for (_, path) in &found[from..] {
                std::fs::remove_file(path)?;
            }
        }
        let next = entries
            .last()
            .map_or(1, |(commit, _)| commit + 1)
            .max(floor + 1);
        let current = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(segment_path(dir, next))?;
        let spare = Arc::new(Spare::default());
        let preparer = match spares {
            Some(space) => {
                let (dir, spare) = (dir.to_owned(), spare.clone());
                Some(
                    std::thread::Builder::new()
                        .name("sluice-wal-spare".into())
                        .spawn(move || prepare_spares(&dir, &spare, &space))?,
                )
            }
            None => None,
        };
        let wal = WalFile {
            dir: dir.to_owned(),
            segments: Mutex::new(Segments {
                current: Arc::new(current),
                current_first: next,
                current_bytes: 0,
                current_zeroed: false,
                next_commit: next,
                closed: kept,
                unsynced: Vec::new(),
                directory_changed: true,
                buffer: Vec::new(),
            }),
            spare,
            preparer,
        };
        Ok((wal, entries))
    }

    /// The number the next commit must have.
    pub fn next_commit(&self) -> u64 {
        lock(&self.segments).next_commit
    }

    /// Appends commit `commit`, durable after the next `sync`; answers the bytes it wrote.
    pub fn append(&self, commit: u64, entry: &Entry) -> Result<u64, StoreError> {
        let mut segments = lock(&self.segments);
        let segments = &mut *segments;
        if commit != segments.next_commit {
            return Err(corrupt(
                "write-ahead log",
                format!(
                    "commit {commit} out of order: {} is next",
                    segments.next_commit
                ),
            ));
        }
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
        // Move on when the record would not fit, or as soon as a zeroed spare can replace the
        // plain segment begun at opening.
        let full = segments.current_bytes + buffer.len() as u64 > SEGMENT_BYTES;
        let plain = !segments.current_zeroed && lock(&self.spare.state).ready.is_some();
        if segments.current_bytes > 0 && (full || plain) {
            let (file, zeroed) = self.next_segment(commit)?;
            let finished = segment_path(&self.dir, segments.current_first);
            segments.closed.push((segments.current_first, finished));
            segments.current = Arc::new(file);
            segments.current_first = commit;
            segments.current_bytes = 0;
            segments.current_zeroed = zeroed;
            segments.directory_changed = true;
        }
        let at = segments.current_bytes;
        if let Err(error) = segments.current.write_all_at(&segments.buffer, at) {
            // A write cut short by a full disk leaves part of a record; zeroed (over blocks
            // already allocated, so it needs no space) it cannot be read as one later. The
            // next append takes the same offset and number.
            let _ = zero_range(&segments.current, at, segments.buffer.len());
            return Err(error.into());
        }
        let written = segments.buffer.len() as u64;
        segments.current_bytes += written;
        segments.next_commit += 1;
        if !segments
            .unsynced
            .iter()
            .any(|file| Arc::ptr_eq(file, &segments.current))
        {
            segments.unsynced.push(segments.current.clone());
        }
        Ok(written)
    }

    /// The segment that starts at `first_commit`, and whether it is zeroed: the spare when it
    /// is ready, else a plain new file (slower to sync, correct all the same).
    fn next_segment(&self, first_commit: u64) -> Result<(File, bool), StoreError> {
        let path = segment_path(&self.dir, first_commit);
        let ready = {
            let mut spare = lock(&self.spare.state);
            // Renamed before the preparer hears of it: it makes its next spare under the same
            // name, which must not be this file any more.
            let ready = match spare.ready.take() {
                Some(file) => {
                    std::fs::rename(self.dir.join(SPARE_NAME), &path)?;
                    Some(file)
                }
                None => None,
            };
            self.spare.changed.notify_all();
            ready
        };
        match ready {
            Some(file) => Ok((file, true)),
            None => Ok((
                OpenOptions::new()
                    .create(true)
                    .truncate(true)
                    .write(true)
                    .open(path)?,
                false,
            )),
        }
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
            fail::fail_point!("wal-sync", |_| Err(StoreError::Io(std::io::Error::other(
                "injected failure of the write-ahead log's fdatasync"
            ))));
            file.sync_data()?;
        }
        if directory_changed {
            fail::fail_point!("wal-dir-sync", |_| Err(StoreError::Io(
                std::io::Error::other("injected failure of the write-ahead directory's fsync")
            )));
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

impl Drop for WalFile {
    fn drop(&mut self) {
        lock(&self.spare.state).stop = true;
        self.spare.changed.notify_all();
        if let Some(preparer) = self.preparer.take() {
            let _ = preparer.join();
        }
    }
}

/// Zeros `len` bytes at `at`, best effort.
fn zero_range(file: &File, at: u64, len: usize) -> std::io::Result<()> {
    let zeros = vec![0u8; len.min(ZERO_WRITE_BYTES)];
    let mut done = 0;
    while done < len {
        let piece = (len - done).min(zeros.len());
        file.write_all_at(&zeros[..piece], at + done as u64)?;
        done += piece;
    }
    Ok(())
}

/// The preparer thread: keeps one zeroed spare segment ready, at a low priority. A spare is
/// only laid down while the disk holds it and the store's reserve besides, so a nearly full
/// disk is not filled by zeros; the log then goes on in plain segments.
fn prepare_spares(dir: &Path, spare: &Spare, space: &DiskSpace) {
    super::util::lower_priority();
    let path = dir.join(SPARE_NAME);
    let mut warned = false;
    loop {
        {
            let mut state = lock(&spare.state);
            while state.ready.is_some() && !state.stop {
                state = spare.changed.wait(state).unwrap_or_else(|p| p.into_inner());
            }
            if state.stop {
                return;
            }
        }
        let room = space
            .free_bytes_now()
            .is_ok_and(|free| free >= space.min_free_bytes().saturating_add(SEGMENT_BYTES));
        let prepared = if room {
            zeroed_segment(&path, spare)
        } else {
            Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no room for a zeroed segment beside the store's reserve",
            )))
        };
        match prepared {
            Ok(Some(file)) => {
                lock(&spare.state).ready = Some(file);
                warned = false;
            }
            Ok(None) => {
                let _ = std::fs::remove_file(&path);
                return;
            }
            Err(error) => {
                // A spare cut short by a full disk would hold the space it took.
                let _ = std::fs::remove_file(&path);
                if !warned {
                    tracing::warn!(%error, "cannot prepare the next write-ahead segment; the log goes on in plain segments");
                    warned = true;
                }
                let state = lock(&spare.state);
                if state.stop {
                    return;
                }
                let _ = spare
                    .changed
                    .wait_timeout(state, std::time::Duration::from_secs(1));
            }
        }
    }
}

/// A file of `SEGMENT_BYTES` zeros, synced; none when the log is closing meanwhile.
fn zeroed_segment(path: &Path, spare: &Spare) -> Result<Option<File>, StoreError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)?;
    let zeros = vec![0u8; ZERO_WRITE_BYTES];
    let mut at = 0;
    while at < SEGMENT_BYTES {
        if lock(&spare.state).stop {
            return Ok(None);
        }
        for piece in 0..(ZERO_CHUNK_BYTES / ZERO_WRITE_BYTES) as u64 {
            file.write_all_at(&zeros, at + piece * ZERO_WRITE_BYTES as u64)?;
        }
        // A failed sync here loses only zeros laid down ahead: the spare is dropped (and made
        // again later), and the log, whose own syncs are what acknowledge, goes on.
        fail::fail_point!("wal-spare-sync", |_| Err(StoreError::Io(
            std::io::Error::other("injected failure of a spare segment's fdatasync")
        )));
        file.sync_data()?;
        at += ZERO_CHUNK_BYTES as u64;
    }
    Ok(Some(file))
}

/// What an open does with damage that is not a torn tail: refuse to start, naming the file and
/// offset, or (for `sluice repair`) cut the log there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    Refuse,
    Salvage,
}

/// Reads a segment's records into `entries`, up to the first zero header. Records torn by a
/// crash at the end of the last segment are zeroed out (they were never acknowledged). Damage
/// anywhere else — in an earlier segment, or in the last one with intact records after it — is
/// refused as corruption; with `Damage::Salvage` the segment is cut there instead and the cut
/// is described in the answer.
fn read_segment(
    path: &Path,
    first_commit: u64,
    last: bool,
    damage: Damage,
    entries: &mut Vec<(u64, Entry)>,
) -> Result<Option<String>, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)?.read_to_end(&mut bytes)?;
    let mut at = 0;
    let mut expected = first_commit;
    while at + HEADER_BYTES <= bytes.len() && bytes[at..at + HEADER_BYTES].iter().any(|&b| b != 0) {
        match record_at(&bytes, at).filter(|(commit, _, _)| *commit == expected) {
            Some((commit, body, next)) => {
                entries.push((commit, wal::decode(body)?));
                at = next;
                expected += 1;
            }
            None => break,
        }
    }
    // Past the records there may only be zeros; anything else is a torn append, or damage.
    if bytes[at..].iter().all(|&b| b == 0) {
        return Ok(None);
    }
    let later = later_record(&bytes, at, expected);
    if last && later.is_none() {
        tracing::warn!(
            path = %path.display(),
            offset = at,
            "zeroing write-ahead records torn by a crash"
        );
        zero_from(path, at, bytes.len())?;
        return Ok(None);
    }
    let what = match later {
        Some(offset) => format!(
            "{} is damaged at byte {at} (commit {expected}), with intact records after it (byte {offset})",
            path.display()
        ),
        None => format!(
            "{} is damaged at byte {at} (commit {expected}), and later segments follow it",
            path.display()
        ),
    };
    match damage {
        Damage::Refuse => Err(corrupt(
            "write-ahead log",
            format!(
                "{what}; acknowledged commits may be in the damaged part. `sluice repair` cuts \
                 the log there, keeping a copy"
            ),
        )),
        Damage::Salvage => {
            zero_from(path, at, bytes.len())?;
            Ok(Some(format!("{what}: cut at byte {at}")))
        }
    }
}

/// Zeroes `path` from `at` to `len` and syncs it.
fn zero_from(path: &Path, at: usize, len: usize) -> Result<(), StoreError> {
    let file = OpenOptions::new().write(true).open(path)?;
    file.write_all_at(&vec![0u8; len - at], at as u64)?;
    file.sync_data()?;
    Ok(())
}

/// Where an intact record of a commit after `expected` begins, past `from`, if anywhere: a
/// torn tail has none, damage in the middle has. Only offsets whose commit number looks like
/// one of the next million commits are checksummed, so the scan stays linear.
fn later_record(bytes: &[u8], from: usize, expected: u64) -> Option<usize> {
    (from + 1..bytes.len().saturating_sub(HEADER_BYTES + 8)).find(|&at| {
        let commit_bytes = &bytes[at + HEADER_BYTES..at + HEADER_BYTES + 8];
        let commit = u64::from_be_bytes(commit_bytes.try_into().unwrap_or([0; 8]));
        commit > expected
            && commit - expected < 1_000_000
            && record_at(bytes, at).is_some_and(|(found, _, _)| found == commit)
    })
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

    /// A tmpfs of `size_mb` MiB mounted for one test, unmounted when dropped; `None` where the
    /// machine does not allow it (CI, as root, sets `SLUICE_REQUIRE_TMPFS`: there it must run).
    struct Tmpfs(tempfile::TempDir);

    impl Tmpfs {
        fn mount(size_mb: u64) -> Option<Tmpfs> {
            let dir = tempfile::tempdir().unwrap();
            let mounted = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
                .arg(dir.path())
                .output();
            if mounted.as_ref().is_ok_and(|o| o.status.success()) {
                return Some(Tmpfs(dir));
            }
            assert!(
                std::env::var_os("SLUICE_REQUIRE_TMPFS").is_none(),
                "cannot mount a tmpfs: {mounted:?}"
            );
            println!("skipped: cannot mount a tmpfs here; run as root to test a real full disk");
            None
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.0.path())
                .status();
        }
    }

    fn big_entry(n: u8, bytes: usize) -> Entry {
        Entry {
            payloads: vec![(
                sluice_model::TaskId::from_bytes([n; 16]),
                Arc::from(vec![n; bytes]),
            )],
            ..entry(n)
        }
    }

    #[test]
    fn an_append_refused_by_a_full_disk_writes_nothing_and_the_next_one_takes_its_place() {
        let Some(disk) = Tmpfs::mount(4) else {
            return;
        };
        let dir = disk.0.path().join("wal");
        let (wal, _) = WalFile::open_with(&dir, 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
        wal.append(1, &entry(1)).unwrap();
        // Take all but 256 KiB, then append a commit of 1 MiB: ENOSPC part way through.
        let filler = disk.0.path().join("filler");
        let mut file = File::create(&filler).unwrap();
        loop {
            let stat = rustix::fs::statvfs(disk.0.path()).unwrap();
            if stat.f_bavail * stat.f_frsize <= 256 << 10 {
                break;
            }
            std::io::Write::write_all(&mut file, &[7u8; 64 << 10]).unwrap();
        }
        drop(file);
        let refused = wal.append(2, &big_entry(2, 1 << 20)).unwrap_err();
        assert!(refused.is_full(), "{refused}");
        assert_eq!(wal.next_commit(), 2, "a refused append takes no number");
        // A small commit still fits, under the same number; then with room the large one.
        wal.append(2, &entry(2)).unwrap();
        std::fs::remove_file(&filler).unwrap();
        wal.append(3, &big_entry(3, 1 << 20)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, found) =
            WalFile::open_with(&dir, 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
        let commits: Vec<u64> = found.iter().map(|(c, _)| *c).collect();
        assert_eq!(commits, [1, 2, 3]);
        assert!(found[1].1.payloads.is_empty(), "commit 2 is the small one");
        assert_eq!(found[2].1.payloads[0].1.len(), 1 << 20);
    }

    #[test]
    fn commits_read_back_in_order_and_a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, found) =
                WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
            assert!(found.is_empty());
            for commit in 1..=3 {
                wal.append(commit, &entry(commit as u8)).unwrap();
            }
            wal.sync().unwrap();
        }
        // A crash in the middle of the fourth append.
        let segment = segment_path(dir.path(), 1);
        let mut file = OpenOptions::new().append(true).open(&segment).unwrap();
        std::io::Write::write_all(&mut file, &[0, 0, 0, 40, 1, 2]).unwrap();
        drop(file);
        let (wal, found) =
            WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
        let commits: Vec<u64> = found.iter().map(|(c, _)| *c).collect();
        assert_eq!(commits, [1, 2, 3]);
        assert_eq!(found[2].1.blocks[0].0, 3);
        wal.append(4, &entry(4)).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (wal, found) =
            WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
        assert_eq!(
            found.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        // Under floor 3 only the segment holding 1..=3 is spent; 4's stays. (The store opens
        // its log with the floor it keeps in sled; commits under it need no segment.)
        wal.release(3).unwrap();
        let (_, found) =
            WalFile::open_with(dir.path(), 3, None, Damage::Refuse, &mut Vec::new()).unwrap();
        assert_eq!(found.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [4]);
    }

    #[test]
    fn records_in_a_zeroed_spare_segment_end_at_its_zeros() {
        let dir = tempfile::tempdir().unwrap();
        {
            let space = Arc::new(DiskSpace::new(dir.path(), 0));
            let (wal, _) = WalFile::open(dir.path(), 0, space).unwrap();
            wal.append(1, &entry(1)).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while lock(&wal.spare.state).ready.is_none() {
                assert!(std::time::Instant::now() < deadline, "no spare segment");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // The spare takes over at the next append.
            wal.append(2, &entry(2)).unwrap();
            wal.append(3, &entry(3)).unwrap();
            wal.sync().unwrap();
            assert!(lock(&wal.segments).current_zeroed);
            assert_eq!(
                std::fs::metadata(segment_path(dir.path(), 2))
                    .unwrap()
                    .len(),
                SEGMENT_BYTES
            );
        }
        let (_, found) =
            WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
        assert_eq!(found.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [1, 2, 3]);
    }

    #[test]
    fn damage_before_the_last_segment_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) =
                WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
            wal.append(1, &entry(1)).unwrap();
            wal.sync().unwrap();
        }
        {
            let (wal, _) =
                WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()).unwrap();
            wal.append(2, &entry(2)).unwrap();
            wal.sync().unwrap();
        }
        let mut bytes = std::fs::read(segment_path(dir.path(), 1)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        std::fs::write(segment_path(dir.path(), 1), bytes).unwrap();
        assert!(matches!(
            WalFile::open_with(dir.path(), 0, None, Damage::Refuse, &mut Vec::new()),
            Err(StoreError::Corrupt { .. })
        ));
    }

    fn commits(found: &[(u64, Entry)]) -> Vec<u64> {
        found.iter().map(|(c, _)| *c).collect()
    }

    fn reopen(dir: &Path) -> Result<(WalFile, Vec<(u64, Entry)>), StoreError> {
        WalFile::open_with(dir, 0, None, Damage::Refuse, &mut Vec::new())
    }

    #[test]
    fn damage_inside_the_last_segment_with_records_after_it_is_refused_and_repair_cuts_it() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (wal, _) = reopen(dir.path()).unwrap();
            for commit in 1..=5 {
                wal.append(commit, &entry(commit as u8)).unwrap();
            }
            wal.sync().unwrap();
        }
        let segment = segment_path(dir.path(), 1);
        let mut bytes = std::fs::read(&segment).unwrap();
        let (_, _, second) = record_at(&bytes, 0).unwrap();
        // A flipped byte in the body of commit 2; commits 3 to 5 are intact after it.
        bytes[second + HEADER_BYTES + 9] ^= 0xFF;
        std::fs::write(&segment, &bytes).unwrap();
        let refused = reopen(dir.path()).err().expect("the open is refused");
        let message = refused.to_string();
        assert!(
            message.contains(&segment.display().to_string()),
            "{message}"
        );
        assert!(message.contains(&format!("byte {second}")), "{message}");
        assert!(message.contains("sluice repair"), "{message}");
        // Not zeroed by the refused open: the damage and what follows it are still there.
        assert_eq!(std::fs::read(&segment).unwrap(), bytes);

        let cuts = WalFile::salvage(dir.path(), 0).unwrap();
        assert_eq!(cuts.len(), 1, "{cuts:?}");
        assert!(
            cuts[0].contains(&format!("cut at byte {second}")),
            "{cuts:?}"
        );
        let (_, found) = reopen(dir.path()).unwrap();
        assert_eq!(commits(&found), [1]);
        assert!(
            WalFile::salvage(dir.path(), 0).unwrap().is_empty(),
            "a sound log is left alone"
        );
    }

    #[test]
    fn a_segment_that_ends_early_before_a_later_one_is_refused_and_repair_cuts_there() {
        let dir = tempfile::tempdir().unwrap();
        for commits in [1..=2, 3..=4, 5..=5] {
            let (wal, _) = reopen(dir.path()).unwrap();
            for commit in commits {
                wal.append(commit, &entry(commit as u8)).unwrap();
            }
            wal.sync().unwrap();
        }
        // Commit 2, at the end of the first segment, is lost; the segment still reads cleanly.
        let first = segment_path(dir.path(), 1);
        let mut bytes = std::fs::read(&first).unwrap();
        let (_, _, second) = record_at(&bytes, 0).unwrap();
        bytes[second..].fill(0);
        std::fs::write(&first, &bytes).unwrap();
        let message = reopen(dir.path()).err().expect("refused").to_string();
        assert!(message.contains("commits 2 to 2 are missing"), "{message}");

        let cuts = WalFile::salvage(dir.path(), 0).unwrap();
        assert_eq!(cuts.len(), 1, "{cuts:?}");
        assert!(!segment_path(dir.path(), 3).exists());
        assert!(!segment_path(dir.path(), 5).exists());
        let (_, found) = reopen(dir.path()).unwrap();
        assert_eq!(commits(&found), [1]);
    }
}
