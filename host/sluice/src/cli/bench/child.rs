//! A `sluice serve` child process for the benchmarks, stopped with SIGTERM when dropped.

use anyhow::{Context, bail};
use sluice_store_postgres::{drop_scratch_database, redacted, scratch_database};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ChildServer {
    child: Child,
    pub url: String,
    /// From spawning the process to its `listening on` line.
    pub ready_after: Duration,
    _data_dir: Option<tempfile::TempDir>,
    /// A scratch PostgreSQL database the child keeps its state in, dropped after it stops.
    scratch_database: Option<String>,
}

impl ChildServer {
    /// A server on a new temporary directory, removed when the child is dropped.
    pub fn start_fresh() -> anyhow::Result<ChildServer> {
        let data_dir = tempfile::tempdir().context("cannot create a temporary data directory")?;
        let mut child = Self::start(data_dir.path())?;
        child._data_dir = Some(data_dir);
        Ok(child)
    }

    /// A server keeping its state in a new database on the PostgreSQL server `server_url`
    /// points at; the database is dropped when the child is dropped.
    pub fn start_fresh_on_postgres(server_url: &str) -> anyhow::Result<ChildServer> {
        let data_dir = tempfile::tempdir().context("cannot create a temporary data directory")?;
        let database = scratch_database(server_url, "sluice_bench")
            .context("cannot create the bench's database")?;
        let started = Self::spawn(&[
            "serve".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data-dir".as_ref(),
            data_dir.path().as_os_str(),
            "--store".as_ref(),
            database.as_ref(),
        ]);
        match started {
            Ok(mut child) => {
                child._data_dir = Some(data_dir);
                child.scratch_database = Some(database);
                Ok(child)
            }
            Err(error) => {
                let _ = drop_scratch_database(&database);
                Err(error)
            }
        }
    }

    /// A server on `data_dir`, which it leaves in place.
    pub fn start(data_dir: &Path) -> anyhow::Result<ChildServer> {
        Self::spawn(&[
            "serve".as_ref(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--data-dir".as_ref(),
            data_dir.as_os_str(),
        ])
    }

    fn spawn(args: &[&OsStr]) -> anyhow::Result<ChildServer> {
        let exe = std::env::current_exe().context("cannot find the sluice executable")?;
        let started = Instant::now();
        let mut child = Command::new(exe)
            .args(args)
            .env(
                "SLUICE_LOG",
                std::env::var("SLUICE_BENCH_SERVER_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start sluice serve")?;
        let stdout = child.stdout.take().context("no stdout from sluice serve")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let ready_after = started.elapsed();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next());
        let Some(url) = url else {
            let _ = child.kill();
            bail!(
                "sluice serve did not announce its address (got `{}`)",
                line.trim()
            );
        };
        Ok(ChildServer {
            url: url.to_owned(),
            child,
            ready_after,
            _data_dir: None,
            scratch_database: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The child's resident memory, from /proc (Linux only).
    pub fn resident_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
        if let Some(database) = &self.scratch_database
            && let Err(error) = drop_scratch_database(database)
        {
            eprintln!(
                "could not drop the bench's database {}: {error}",
                redacted(database)
            );
        }
    }
}
