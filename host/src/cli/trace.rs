//! `sluice trace gen|import`: workload traces for simulations (the format: docs/traces.md),
//! written to stdout or `--out FILE`.

use anyhow::Context;
use sluice::trace::generate::{Shape, generate};
use sluice::trace::import::{Columns, TimeUnit, import};
use sluice::trace::{TraceTask, write_task};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The most tasks one command writes: a million-task trace is about 250 MB.
const MAX_TASKS: usize = 50_000_000;

#[derive(clap::Subcommand)]
pub enum TraceCommand {
    /// A synthetic trace from a seed: the same arguments write the same bytes.
    Gen {
        #[arg(long)]
        tasks: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, value_enum, default_value = "steady")]
        shape: Shape,
        /// Where to write it [default: stdout]
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A trace from a cluster trace in CSV (a header row first), through a column mapping:
    /// e.g. --columns submit=start_time,service=duration,priority=prio:0=low/1=normal/2=urgent
    Import {
        #[arg(long)]
        csv: PathBuf,
        /// field=COLUMN pairs: submit and service (or end) at least; priority=COLUMN:MAP,
        /// kind, tenant, device, est, gpus, gpu_memory_mb optionally.
        #[arg(long)]
        columns: String,
        /// The unit of the CSV's times (made relative to the first submission).
        #[arg(long, value_enum, default_value = "s")]
        time_unit: TimeUnit,
        /// Refuse a CSV of more rows (all rows are held to sort them).
        #[arg(long, default_value_t = 5_000_000)]
        max_tasks: usize,
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

pub fn run(command: TraceCommand) -> anyhow::Result<()> {
    match command {
        TraceCommand::Gen {
            tasks,
            seed,
            shape,
            out,
        } => {
            if tasks == 0 || tasks > MAX_TASKS {
                anyhow::bail!("--tasks must be 1 to {MAX_TASKS}");
            }
            write_trace(out.as_deref(), generate(shape, tasks, seed))
        }
        TraceCommand::Import {
            csv,
            columns,
            time_unit,
            max_tasks,
            out,
        } => {
            let columns: Columns = columns.parse()?;
            let file = std::fs::File::open(&csv)
                .with_context(|| format!("cannot open {}", csv.display()))?;
            let tasks = import(
                std::io::BufReader::new(file),
                &columns,
                time_unit,
                max_tasks,
            )
            .with_context(|| format!("cannot import {}", csv.display()))?;
            write_trace(out.as_deref(), tasks)
        }
    }
}

fn write_trace(
    out: Option<&Path>,
    tasks: impl IntoIterator<Item = TraceTask>,
) -> anyhow::Result<()> {
    let mut sink: Box<dyn Write> = match out {
        Some(path) => Box::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut sink = std::io::BufWriter::new(&mut sink);
    for task in tasks {
        write_task(&mut sink, &task)?;
    }
    sink.flush()?;
    Ok(())
}
