//! Workload traces: the JSONL format a simulation replays (one task a line, in submission
//! order), its bounded reader and its writer; `generate` makes synthetic traces from a seed and
//! `import` reads cluster traces from CSV; `export` writes one from a server's records. The
//! format is documented in `docs/traces.md`.

pub mod export;
pub mod generate;
pub mod import;

use serde::{Deserialize, Serialize};
use sluice_model::{FailureClass, Hit, Priority, VECTOR_MAX_K};
use std::io::{BufRead, Write};

/// The longest line a trace may have: a task is a few hundred bytes, a search with its
/// children's hits (`--with-hits`) up to about 40 bytes a hit.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// The most children a recorded search may have.
pub const MAX_RECORDED_CHILDREN: usize = 1_024;
/// The most failed attempts one task may script.
pub const MAX_FAILURES: usize = 16;
/// The longest service time a task may have: a day.
pub const MAX_SERVICE_MS: u64 = 24 * 3_600_000;

/// One task of a trace. Unknown fields are refused, so a typo is an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceTask {
    /// When the task is submitted, in ms from the trace's start; never less than the line
    /// before's.
    pub submit_ms: u64,
    #[serde(default)]
    pub priority: Priority,
    #[serde(default = "default_kind")]
    pub kind: String,
    #[serde(default = "default_name")]
    pub tenant: String,
    #[serde(default = "default_name")]
    pub device: String,
    /// What the device estimates one attempt takes (the task's `est_exec_ms`); by default the
    /// service time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub est_exec_ms: Option<u64>,
    /// How long an attempt actually runs on a worker.
    pub service_ms: u64,
    /// GPUs the task needs (0: any worker).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub gpus: u32,
    /// GPU memory the task needs, in MB (0: any).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub gpu_memory_mb: u64,
    /// The model it runs (`resources.model`): a simulated worker loads it onto the GPU the
    /// attempt runs on, paying `--model-load-ms` when that GPU held another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What it shares with the others of a GPU batch beside its kind and model
    /// (`resources.batch_key`): with `sluice sim --batch`, tasks batch only with their own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_key: Option<String>,
    /// How its first attempts fail, in order; the attempt after the last one listed succeeds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureClass>,
    /// A split search's children's answers (`sluice trace export --with-hits`): what
    /// `sluice sim --merge` merges again. A replay runs the task whole and ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<RecordedSearch>,
}

/// What the children of one split search answered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedSearch {
    /// Hits the search asked for.
    pub k: u32,
    pub children: Vec<RecordedChild>,
}

/// One child: its weight in a weighted merge and its hits, nearest first (none when it did
/// not answer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedChild {
    pub weight: f32,
    #[serde(default)]
    pub hits: Vec<Hit>,
}

impl RecordedSearch {
    fn problem(&self) -> Option<String> {
        if self.k == 0 || self.k > VECTOR_MAX_K {
            return Some(format!("search.k must be 1 to {VECTOR_MAX_K}"));
        }
        if self.children.len() > MAX_RECORDED_CHILDREN {
            return Some(format!(
                "search has {} children; at most {MAX_RECORDED_CHILDREN}",
                self.children.len()
            ));
        }
        for child in &self.children {
            if !child.weight.is_finite() || child.weight < 0.0 {
                return Some("a child's weight must be finite and not negative".into());
            }
            if child.hits.len() > VECTOR_MAX_K as usize {
                return Some(format!("a child has more than {VECTOR_MAX_K} hits"));
            }
            if child.hits.iter().any(|h| !h.distance.is_finite()) {
                return Some("a hit's distance must be finite".into());
            }
        }
        None
    }
}

fn default_kind() -> String {
    "oct.scan".into()
}

fn default_name() -> String {
    "default".into()
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

impl TraceTask {
    /// A task of `service_ms` submitted at `submit_ms`, every other field its default.
    pub fn at(submit_ms: u64, service_ms: u64) -> TraceTask {
        TraceTask {
            submit_ms,
            priority: Priority::Normal,
            kind: default_kind(),
            tenant: default_name(),
            device: default_name(),
            est_exec_ms: None,
            service_ms,
            gpus: 0,
            gpu_memory_mb: 0,
            model: None,
            batch_key: None,
            failures: Vec::new(),
            search: None,
        }
    }

    /// What is wrong with this task on its own, if anything.
    fn problem(&self) -> Option<String> {
        if self.service_ms > MAX_SERVICE_MS {
            return Some(format!(
                "service_ms {} is over a day ({MAX_SERVICE_MS})",
                self.service_ms
            ));
        }
        if self.failures.len() > MAX_FAILURES {
            return Some(format!(
                "{} failures scripted; at most {MAX_FAILURES}",
                self.failures.len()
            ));
        }
        if let Some(Err(error)) = self
            .model
            .as_deref()
            .map(|model| sluice_model::check_name("model", model))
        {
            return Some(error.to_string());
        }
        if let Some(Err(error)) = self
            .batch_key
            .as_deref()
            .map(|key| sluice_model::check_name("batch_key", key))
        {
            return Some(error.to_string());
        }
        if let Some(problem) = self.search.as_ref().and_then(RecordedSearch::problem) {
            return Some(problem);
        }
        if self.failures.contains(&FailureClass::LeaseExpired) {
            return Some("lease-expired is the scheduler's to set, not a trace's".into());
        }
        for (field, name) in [
            ("kind", &self.kind),
            ("tenant", &self.tenant),
            ("device", &self.device),
        ] {
            if name.is_empty() || name.len() > 128 {
                return Some(format!("{field} must be 1 to 128 bytes"));
            }
        }
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("line {line}: {detail}")]
    Invalid { line: u64, detail: String },
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads a trace one task at a time, checking each line and that time never goes back.
pub struct TraceReader<R> {
    input: R,
    line: u64,
    last_submit_ms: u64,
    buffer: Vec<u8>,
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(input: R) -> TraceReader<R> {
        TraceReader {
            input,
            line: 0,
            last_submit_ms: 0,
            buffer: Vec::new(),
        }
    }

    fn invalid(&self, detail: impl Into<String>) -> TraceError {
        TraceError::Invalid {
            line: self.line,
            detail: detail.into(),
        }
    }

    /// The next task, `None` at the end; blank lines are skipped.
    pub fn next_task(&mut self) -> Result<Option<TraceTask>, TraceError> {
        loop {
            self.buffer.clear();
            self.line += 1;
            // Bounded: a line longer than the limit is refused without reading all of it.
            let mut line = std::io::Read::take(&mut self.input, MAX_LINE_BYTES as u64 + 1);
            let read = line.read_until(b'\n', &mut self.buffer)?;
            if read == 0 {
                return Ok(None);
            }
            if self.buffer.len() > MAX_LINE_BYTES {
                return Err(self.invalid(format!("longer than {MAX_LINE_BYTES} bytes")));
            }
            if self.buffer.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let task: TraceTask =
                serde_json::from_slice(&self.buffer).map_err(|e| self.invalid(e.to_string()))?;
            if let Some(problem) = task.problem() {
                return Err(self.invalid(problem));
            }
            if task.submit_ms < self.last_submit_ms {
                return Err(self.invalid(format!(
                    "submit_ms {} is before the line above's {}: a trace is in submission order",
                    task.submit_ms, self.last_submit_ms
                )));
            }
            self.last_submit_ms = task.submit_ms;
            return Ok(Some(task));
        }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<TraceTask, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_task().transpose()
    }
}

/// Writes `task` as one line.
pub fn write_task(out: &mut impl Write, task: &TraceTask) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, task)?;
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests;
