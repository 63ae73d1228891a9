//! Real small filesystems for the full-disk tests: a size-limited tmpfs mounted for one test,
//! and a filler file that takes its space.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of a given size, unmounted when dropped.
pub struct Tmpfs {
    path: PathBuf,
    /// Removed after `drop` has unmounted what is mounted in it.
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size_mb` MiB; `None` (with a line saying why) where this machine does
    /// not allow it, unless `SLUICE_REQUIRE_TMPFS` is set, as CI sets it: there it must run.
    pub fn mount(size_mb: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join("mnt");
        std::fs::create_dir(&path).expect("a mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m"), "tmpfs"])
            .arg(&path)
            .output();
        match mounted {
            Ok(output) if output.status.success() => Some(Tmpfs { path, _dir: dir }),
            other => {
                let why = match other {
                    Ok(output) => String::from_utf8_lossy(&output.stderr).trim().to_owned(),
                    Err(error) => error.to_string(),
                };
                assert!(
                    std::env::var_os("SLUICE_REQUIRE_TMPFS").is_none(),
                    "cannot mount a tmpfs: {why}"
                );
                println!(
                    "skipped: cannot mount a tmpfs here ({why}); run as root to test a real full disk"
                );
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Bytes an unprivileged writer may still use on the filesystem holding `path`.
pub fn free_bytes(path: &Path) -> u64 {
    let stat = rustix::fs::statvfs(path).expect("statvfs");
    stat.f_bavail * stat.f_frsize
}

/// Writes `dir/filler` until at most `leave_bytes` are free (or the disk refuses more), and
/// answers its path.
pub fn fill(dir: &Path, leave_bytes: u64) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("create the filler");
    let chunk = vec![0xA5u8; 256 << 10];
    loop {
        let free = free_bytes(dir);
        if free <= leave_bytes {
            break;
        }
        let take = (free - leave_bytes).min(chunk.len() as u64) as usize;
        if file.write_all(&chunk[..take]).is_err() {
            break;
        }
    }
    let _ = file.sync_all();
    path
}
