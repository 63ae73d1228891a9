//! Logging through tracing on stderr (stdout carries only command output), filtered by
//! `SLUICE_LOG` (default `info`; the demo's default is `warn`, so its own output reads clearly).

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| e.to_string())
}
