//! Cluster traces from CSV (`sluice trace import`): a column mapping names which CSV column
//! holds each trace field, a value map turns the cluster's priority values into buckets, and
//! times in seconds or ms, absolute or relative, become ms from the first submission.

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
/// instead of `service`: service runs from submit to end), and optionally `priority=COL:MAP`
/// (MAP is `value=bucket` pairs joined by `/`, e.g. `0=low/1=normal/2=urgent`), `kind`,
/// `tenant`, `device`, `est`, `gpus`, `gpu_memory_mb`, `model`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Columns {
    fields: BTreeMap<String, String>,
    priorities: BTreeMap<String, Priority>,
}

const FIELDS: [&str; 10] = [
    "submit", "service", "end", "priority", "kind", "tenant", "device", "est", "gpus", "model",
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
        Ok(columns)
    }
}

/// Reads a CSV with a header row into a trace in submission order, at most `max_tasks` rows.
pub fn import(
    input: impl Read,
    columns: &Columns,
    unit: TimeUnit,
    max_tasks: usize,
) -> Result<Vec<TraceTask>, ImportError> {
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
    let mut rows: Vec<(f64, TraceTask)> = Vec::new();
    for (n, record) in reader.records().enumerate() {
        // Row 1 is the header.
        let row = n as u64 + 2;
        if rows.len() == max_tasks {
            return Err(ImportError::TooMany(max_tasks));
        }
        let record = record?;
        let problem = |detail: String| ImportError::Row { row, detail };
        let cell = |field: &str| index.get(field).and_then(|&at| record.get(at));
        let time = |field: &str| -> Result<f64, ImportError> {
            let text = cell(field).unwrap_or_default();
            let value: f64 = text
                .parse()
                .map_err(|_| problem(format!("{field} {text:?} is not a number")))?;
            if !value.is_finite() || value < 0.0 {
                return Err(problem(format!("{field} {text:?} is not a time")));
            }
            Ok(value * scale)
        };
        let submit = time("submit")?;
        let service = if index.contains_key("service") {
            time("service")?
        } else {
            time("end")? - submit
        };
        if !(0.0..=MAX_SERVICE_MS as f64).contains(&service) {
            return Err(problem(format!(
                "service time {service} ms is negative or over a day"
            )));
        }
        let mut task = TraceTask::at(0, service.round() as u64);
        if let Some(value) = cell("priority") {
            task.priority = *columns
                .priorities
                .get(value)
                .ok_or_else(|| problem(format!("priority {value:?} is not in the value map")))?;
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
            task.est_exec_ms = Some(time("est")?.round() as u64);
        }
        let count = |field: &str| -> Result<u64, ImportError> {
            match cell(field) {
                None | Some("") => Ok(0),
                Some(text) => text
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .map(|v| v.round() as u64)
                    .ok_or_else(|| problem(format!("{field} {text:?} is not a count"))),
            }
        };
        task.gpus = u32::try_from(count("gpus")?).unwrap_or(u32::MAX);
        task.gpu_memory_mb = count(GPU_MEMORY)?;
        if let Some(model) = cell("model").filter(|model| !model.is_empty()) {
            sluice_model::check_name("model", model).map_err(|e| problem(e.to_string()))?;
            task.model = Some(model.to_owned());
        }
        rows.push((submit, task));
    }
    // Relative to the first submission, and in its order (stable for equal times).
    let first = rows.iter().map(|(at, _)| *at).fold(f64::INFINITY, f64::min);
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(rows
        .into_iter()
        .map(|(at, mut task)| {
            task.submit_ms = (at - first).round() as u64;
            task
        })
        .collect())
}
