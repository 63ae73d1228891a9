//! Logging through tracing on stderr (stdout carries only command output), filtered by
//! `SLUICE_LOG` (default `info`; the demo's default is `warn`, so its own output reads clearly).
//! `SLUICE_LOG_SPANS=1` also logs each span as it closes, with its fields and time: with
//! `SLUICE_LOG=info,sluice::task=debug` that is every step of every task, by `task_id`.
//!
//! The filter is a list of `level` and `target=level` (tracing-subscriber's `Targets`), not
//! the regex-matched `EnvFilter`: the list is all Sluice's docs use, and the regex engine
//! behind the other was a share of the first build.

use std::io::IsTerminal;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

pub fn init(format: LogFormat, default_level: &str) -> Result<(), String> {
    let filter = filter(std::env::var("SLUICE_LOG").ok().as_deref(), default_level)?;
    let span_events = if spans_requested() {
        FmtSpan::CLOSE
    } else {
        FmtSpan::NONE
    };
    let layer = tracing_subscriber::fmt::layer()
        .with_span_events(span_events)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    let installed = match format {
        LogFormat::Text => registry.with(layer).try_init(),
        LogFormat::Json => registry.with(layer.json()).try_init(),
    };
    installed.map_err(|e| e.to_string())
}

/// `SLUICE_LOG` when set and not blank, else `default_level`. A value that does not parse is
/// an error naming the variable, not a silent fallback: a typo would otherwise hide the logs
/// someone set it to see.
fn filter(given: Option<&str>, default_level: &str) -> Result<Targets, String> {
    match given.map(str::trim).filter(|text| !text.is_empty()) {
        Some(text) => text.parse().map_err(|error| {
            format!(
                "SLUICE_LOG={text:?} is not a filter ({error}): write a level (error, warn, \
                 info, debug, trace) or a comma-separated list of them and target=level, \
                 e.g. info,sluice::task=debug"
            )
        }),
        None => default_level
            .parse()
            .map_err(|error| format!("the default log level {default_level:?}: {error}")),
    }
}

fn spans_requested() -> bool {
    std::env::var("SLUICE_LOG_SPANS")
        .is_ok_and(|value| matches!(value.trim(), "1" | "true" | "yes" | "close"))
}

#[cfg(test)]
mod tests {
    use super::filter;
    use tracing::Level;

    #[test]
    fn a_level_and_targets_parse_and_an_unknown_level_is_an_error_that_names_the_variable() {
        let targets = filter(Some("warn,sluice::task=debug"), "info").unwrap();
        assert!(targets.would_enable("sluice::task", &Level::DEBUG));
        assert!(!targets.would_enable("sluice::server", &Level::INFO));
        assert!(targets.would_enable("sluice::server", &Level::WARN));
        let default = filter(Some("  "), "info").unwrap();
        assert!(default.would_enable("anything", &Level::INFO));
        assert!(!default.would_enable("anything", &Level::DEBUG));
        let error = filter(Some("info,sluice=loud"), "info").unwrap_err();
        assert!(error.contains("SLUICE_LOG=\"info,sluice=loud\""), "{error}");
    }
}
