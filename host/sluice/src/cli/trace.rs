//! `sluice trace gen|import|export`: workload traces for simulations (the format:
//! docs/traces.md), written to stdout or `--out FILE`.

use super::tasks::ServerArg;
use anyhow::Context;
use sluice::trace::export::{DEFAULT_MAX_HITS_BYTES, EventFold, export};
use sluice::trace::generate::{Shape, generate};
use sluice::trace::import::{Columns, TimeUnit, import};
use sluice::trace::{TraceTask, write_task};
use sluice_model::{Event, Task};
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
    /// e.g. --columns submit=start_time,service=duration,priority=prio:0=low/1=normal/2=urgent.
    /// Service times over a day are clipped to a day (and counted)
    Import {
        #[arg(long)]
        csv: PathBuf,
        /// field=COLUMN pairs: submit and service (or end, from start when mapped) at least;
        /// priority=COLUMN:MAP, kind, tenant, device, est, gpus, gpu_memory_mb, model optionally.
        #[arg(long)]
        columns: String,
        /// Leave out rows that cannot be used (an empty time, an end before its start, a
        /// priority not in the map, ...) and count them by reason, instead of refusing the file
        /// at the first
        #[arg(long)]
        skip_invalid: bool,
        /// The unit of the CSV's times (made relative to the first submission).
        #[arg(long, value_enum, default_value = "s")]
        time_unit: TimeUnit,
        /// Refuse a CSV of more rows (all rows are held to sort them).
        #[arg(long, default_value_t = 5_000_000)]
        max_tasks: usize,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// A trace of what a server ran: each ended task's submission, service time and failed
    /// attempts, from its records and its event log (a viewer token with auth on).
    Export {
        #[command(flatten)]
        server: ServerArg,
        /// Refuse a server with more tasks (all are held to sort them).
        #[arg(long, default_value_t = 5_000_000)]
        max_tasks: usize,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Record each completed split search's children's hits (`search` in its line), for
        /// `sluice sim --merge`
        #[arg(long)]
        with_hits: bool,
        /// With --with-hits: write at most about this many bytes of hits (about 40 a hit);
        /// the searches past it are exported without them
        #[arg(long, default_value_t = DEFAULT_MAX_HITS_BYTES, requires = "with_hits")]
        max_hits_bytes: usize,
    },
}

pub async fn run(command: TraceCommand) -> anyhow::Result<()> {
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
            skip_invalid,
            time_unit,
            max_tasks,
            out,
        } => {
            let columns: Columns = columns.parse()?;
            let file = std::fs::File::open(&csv)
                .with_context(|| format!("cannot open {}", csv.display()))?;
            let imported = import(
                std::io::BufReader::new(file),
                &columns,
                time_unit,
                max_tasks,
                skip_invalid,
            )
            .with_context(|| format!("cannot import {}", csv.display()))?;
            // What was changed or left out goes to stderr: stdout may be the trace itself.
            eprintln!("imported {} rows", imported.tasks.len());
            if imported.clipped > 0 {
                eprintln!(
                    "{} rows ran over a day (the longest {:.1} days): their service times are clipped to a day",
                    imported.clipped,
                    imported.longest_clipped_ms as f64 / 86_400_000.0
                );
            }
            for (reason, rows) in &imported.skipped {
                eprintln!("skipped {rows} rows: {reason}");
            }
            if imported.tasks.is_empty() {
                anyhow::bail!("{}: no row could be imported", csv.display());
            }
            write_trace(out.as_deref(), imported.tasks)
        }
        TraceCommand::Export {
            server,
            max_tasks,
            out,
            with_hits,
            max_hits_bytes,
        } => {
            let hits = with_hits.then_some(max_hits_bytes);
            export_trace(&server, max_tasks, out.as_deref(), hits).await
        }
    }
}

/// Pages through the server's tasks and its event log, then writes the ended tasks' trace.
async fn export_trace(
    server: &ServerArg,
    max_tasks: usize,
    out: Option<&Path>,
    max_hits_bytes: Option<usize>,
) -> anyhow::Result<()> {
    let client = server.client()?;
    let mut tasks: Vec<Task> = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut query = vec![("limit", "1000".to_owned())];
        if let Some(after) = &after {
            query.push(("after", after.clone()));
        }
        let mut page = client.list(&query).await?;
        let listed: Vec<sluice_wire::TaskView> = serde_json::from_value(page["tasks"].take())
            .context("the server's task list is not what this version reads")?;
        tasks.extend(listed.into_iter().map(Task::from));
        if tasks.len() > max_tasks {
            anyhow::bail!("the server holds more than --max-tasks {max_tasks} tasks");
        }
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    let mut fold = EventFold::default();
    let mut after_seq = 0;
    loop {
        let mut page = client.log(after_seq, 1000).await?;
        let events: Vec<Event> = serde_json::from_value(page["events"].take())
            .context("the server's event log is not what this version reads")?;
        let Some(last) = events.last() else { break };
        after_seq = last.seq;
        for event in &events {
            fold.add(event);
        }
    }
    let (trace, skipped) = export(tasks, &fold, max_hits_bytes);
    eprintln!(
        "exported {} tasks ({} searches with their hits); left out {} not ended or never run \
         and {} split children{}",
        trace.len(),
        trace.iter().filter(|t| t.search.is_some()).count(),
        skipped.unfinished_or_never_ran,
        skipped.split_children,
        match (max_hits_bytes, skipped.searches_without_hits) {
            (Some(_), n) if n > 0 => format!("; {n} searches without hits (past the cap)"),
            _ => String::new(),
        }
    );
    write_trace(out, trace)
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
