//! Cluster traces from CSV (`sluice trace import`): a column mapping names which CSV column
//! holds each trace field, a value map turns the cluster's priority values into buckets, and
//! times in seconds or ms, absolute or relative, become ms from the first submission. Service
//! times past the trace format's day are clipped to it and counted (real clusters run pods for
//! months); rows that cannot be used are refused, or with `skip_invalid` skipped and counted
//! by reason.

use super::{MAX_SERVICE_MS, TraceTask};
use sluice_model::Priority;
use std::collections::BTreeMap;
use std::io::Read;

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("--columns: {0}")]
    Mapping(String),
    #[error("the CSV has no column {0:?} (its header has: {1})")]
    NoColumn(String, String),
    #[error("row {row}: {detail}")]
    Row { row: u64, detail: String },
    #[error("more than {0} rows; raise --max-tasks, or cut the CSV")]
    TooMany(usize),
    #[error("reading the CSV: {0}")]
    Csv(#[from] csv::Error),
}

/// The unit of the CSV's times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TimeUnit {
    #[value(name = "s")]
    Seconds,
    #[value(name = "ms")]
    Millis,
}

/// Which CSV column holds each trace field: `submit=COL,service=COL` at least (or `end=COL`
/// instead of `service`: service runs from submit to end, or from `start=COL` to end when a
/// start is mapped: a pod's scheduling time, say), and optionally `priority=COL:MAP`
/// (MAP is `value=bucket` pairs joined by `/`, e.g. `0=low/1=normal/2=urgent`), `kind`,
/// `tenant`, `device`, `est`, `gpus`, `gpu_memory_mb`, `model`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Columns {
    fields: BTreeMap<String, String>,
    priorities: BTreeMap<String, Priority>,
}

const FIELDS: [&str; 11] = [
    "submit", "service", "start", "end", "priority", "kind", "tenant", "device", "est", "gpus",
    "model",
];
const GPU_MEMORY: &str = "gpu_memory_mb";

impl std::str::FromStr for Columns {
    type Err = ImportError;

    fn from_str(text: &str) -> Result<Columns, ImportError> {
        let bad = |detail: String| ImportError::Mapping(detail);
        let mut columns = Columns::default();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, column) = pair
                .split_once('=')
                .ok_or_else(|| bad(format!("{pair:?} is not field=COLUMN")))?;
            if !FIELDS.contains(&field) && field != GPU_MEMORY {
                return Err(bad(format!(
                    "unknown field {field:?}; fields are {}, {GPU_MEMORY}",
                    FIELDS.join(", ")
                )));
            }
            let column = if field == "priority" {
                let (column, map) = column.split_once(':').ok_or_else(|| {
                    bad("priority needs a value map: priority=COL:0=low/1=normal/2=urgent".into())
                })?;
                for entry in map.split('/') {
                    let (value, bucket) = entry.split_once('=').ok_or_else(|| {
                        bad(format!("{entry:?} in the priority map is not value=bucket"))
                    })?;
                    let bucket = match bucket {
                        "urgent" => Priority::Urgent,
                        "normal" => Priority::Normal,
                        "low" => Priority::Low,
                        other => {
                            return Err(bad(format!(
                                "{other:?} is not a bucket (urgent, normal, low)"
                            )));
                        }
                    };
                    columns.priorities.insert(value.to_owned(), bucket);
                }
                column
            } else {
                column
            };
            if column.is_empty() {
                return Err(bad(format!("{field} names no column")));
            }
            if columns
                .fields
                .insert(field.to_owned(), column.to_owned())
                .is_some()
            {
                return Err(bad(format!("{field} is mapped twice")));
            }
        }
        let has = |field: &str| columns.fields.contains_key(field);
        if !has("submit") || has("service") == has("end") {
            return Err(bad(
                "map submit, and one of service or end (e.g. submit=start_time,service=duration)"
                    .into(),
            ));
        }
        if has("start") && !has("end") {
            return Err(bad(
                "start goes with end: service runs from start to end (e.g. \
                 submit=creation_time,start=scheduled_time,end=deletion_time)"
                    .into(),
            ));
        }
        Ok(columns)
    }
}

/// A CSV made into a trace: its tasks in submission order, and what was changed or left out.
#[derive(Debug, Default)]
pub struct Imported {
    pub tasks: Vec<TraceTask>,
    /// Rows whose service time was over a day, clipped to a day; and the longest of them, ms.
    pub clipped: u64,
    pub longest_clipped_ms: u64,
    /// With `skip_invalid`, rows left out, by reason (e.g. `no scheduled_time`).
    pub skipped: BTreeMap<String, u64>,
}

/// Why one row cannot be used: a short reason to count it by, and the detail for a refusal.
struct RowProblem {
    reason: String,
    detail: String,
}

/// Reads a CSV with a header row into a trace in submission order, at most `max_tasks` rows.
/// A row that cannot be used is refused with its number, or, with `skip_invalid`, left out and
/// counted by reason.
pub fn import(
    input: impl Read,
    columns: &Columns,
    unit: TimeUnit,
    max_tasks: usize,
    skip_invalid: bool,
) -> Result<Imported, ImportError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .flexible(false)
        .from_reader(input);
    let header: Vec<String> = reader.headers()?.iter().map(str::to_owned).collect();
    let mut index = BTreeMap::new();
    for (field, column) in &columns.fields {
        let at = header
            .iter()
            .position(|h| h == column)
            .ok_or_else(|| ImportError::NoColumn(column.clone(), header.join(", ")))?;
        index.insert(field.as_str(), at);
    }
    let scale = match unit {
        TimeUnit::Seconds => 1_000.0,
        TimeUnit::Millis => 1.0,
    };
    let mut imported = Imported::default();
    let mut rows: Vec<(f64, TraceTask)> = Vec::new();
    for (n, record) in reader.records().enumerate() {
        // Row 1 is the header.
        let row = n as u64 + 2;
        if rows.len() == max_tasks {
            return Err(ImportError::TooMany(max_tasks));
        }
        let record = record?;
        match read_row(&record, &index, columns, scale) {
            Ok((submit, mut task, clipped_from_ms)) => {
                if let Some(from_ms) = clipped_from_ms {
                    imported.clipped += 1;
                    imported.longest_clipped_ms = imported.longest_clipped_ms.max(from_ms);
                    task.service_ms = MAX_SERVICE_MS;
                }
                rows.push((submit, task));
            }
            Err(problem) if skip_invalid => {
                *imported.skipped.entry(problem.reason).or_default() += 1;
            }
            Err(problem) => {
                return Err(ImportError::Row {
                    row,
                    detail: format!("{} (--skip-invalid leaves such rows out)", problem.detail),
                });
            }
        }
    }
    // Relative to the first submission, and in its order (stable for equal times).
    let first = rows.iter().map(|(at, _)| *at).fold(f64::INFINITY, f64::min);
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    imported.tasks = rows
        .into_iter()
        .map(|(at, mut task)| {
            task.submit_ms = (at - first).round() as u64;
            task
        })
        .collect();
    Ok(imported)
}

/// One row as a task, with its submission time (ms, not yet relative) and, when its service
/// time was over a day, that time (the task then runs a day).
fn read_row(
    record: &csv::StringRecord,
    index: &BTreeMap<&str, usize>,
    columns: &Columns,
    scale: f64,
) -> Result<(f64, TraceTask, Option<u64>), RowProblem> {
    let column = |field: &'static str| -> String {
        columns
            .fields
            .get(field)
            .cloned()
            .unwrap_or_else(|| field.to_owned())
    };
    let problem = |reason: String, detail: String| RowProblem { reason, detail };
    let cell = |field: &str| index.get(field).and_then(|&at| record.get(at));
    let time = |field: &'static str| -> Result<f64, RowProblem> {
        let text = cell(field).unwrap_or_default();
        let name = column(field);
        if text.is_empty() {
            return Err(problem(format!("no {name}"), format!("{name} is empty")));
        }
        let value: f64 = text.parse().map_err(|_| {
            problem(
                format!("{name} not a number"),
                format!("{name} {text:?} is not a number"),
            )
        })?;
        if !value.is_finite() || value < 0.0 {
            return Err(problem(
                format!("{name} not a time"),
                format!("{name} {text:?} is not a time"),
            ));
        }
        Ok(value * scale)
    };
    let submit = time("submit")?;
    let service = if index.contains_key("service") {
        time("service")?
    } else {
        let from = if index.contains_key("start") {
            time("start")?
        } else {
            submit
        };
        let end = time("end")?;
        if end < from {
            let from_name = column(if index.contains_key("start") {
                "start"
            } else {
                "submit"
            });
            return Err(problem(
                format!("{} before {from_name}", column("end")),
                format!(
                    "{} is before {from_name}: a negative service time",
                    column("end")
                ),
            ));
        }
        end - from
    };
    let service_ms = service.round() as u64;
    let clipped_from_ms = (service_ms > MAX_SERVICE_MS).then_some(service_ms);
    let mut task = TraceTask::at(0, service_ms.min(MAX_SERVICE_MS));
    if let Some(value) = cell("priority") {
        task.priority = *columns.priorities.get(value).ok_or_else(|| {
            problem(
                format!("{} not in the value map", column("priority")),
                format!("priority {value:?} is not in the value map"),
            )
        })?;
    }
    for (field, slot) in [
        ("kind", &mut task.kind),
        ("tenant", &mut task.tenant),
        ("device", &mut task.device),
    ] {
        if let Some(value) = cell(field).filter(|v| !v.is_empty() && v.len() <= 128) {
            *slot = value.to_owned();
        }
    }
    if index.contains_key("est") {
        let est = (time("est")?.round() as u64).min(MAX_SERVICE_MS);
        task.est_exec_ms = Some(est);
    }
    let count = |field: &'static str| -> Result<u64, RowProblem> {
        match cell(field) {
            None | Some("") => Ok(0),
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| v.round() as u64)
                .ok_or_else(|| {
                    problem(
                        format!("{} not a count", column(field)),
                        format!("{field} {text:?} is not a count"),
                    )
                }),
        }
    };
    task.gpus = u32::try_from(count("gpus")?).unwrap_or(u32::MAX);
    task.gpu_memory_mb = count(GPU_MEMORY)?;
    if let Some(model) = cell("model").filter(|model| !model.is_empty()) {
        sluice_model::check_name("model", model)
            .map_err(|e| problem("a bad model".into(), e.to_string()))?;
        task.model = Some(model.to_owned());
    }
    Ok((submit, task, clipped_from_ms))
}
