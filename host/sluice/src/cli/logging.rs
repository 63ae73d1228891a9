//! Logging through tracing on stderr (stdout carries only command output), filtered by
//! `SLUICE_LOG` (default `info`; the demo's default is `warn`, so its own output reads clearly).
//! `SLUICE_LOG_SPANS=1` also logs each span as it closes, with its fields and time: with
//! `SLUICE_LOG=info,sluice::task=debug` that is every step of every task, by `task_id`.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

pub fn init(format: LogFormat, default_level: &str) -> Result<(), String> {
    let filter =
        EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let span_events = if spans_requested() {
        FmtSpan::CLOSE
    } else {
        FmtSpan::NONE
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(span_events)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| e.to_string())
}

fn spans_requested() -> bool {
    std::env::var("SLUICE_LOG_SPANS")
        .is_ok_and(|value| matches!(value.trim(), "1" | "true" | "yes" | "close"))
}
