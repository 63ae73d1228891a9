//! Command-line parsing and dispatch; errors are reported here, once, with a non-zero exit.

// First, so that every command module sees `outln!`.
#[macro_use]
mod output;

mod bench;
mod demo;
mod experiment;
mod load;
mod logging;
mod policy;
mod policy_js;
mod policy_kit;
mod policy_test;
mod repair;
mod serve;
mod sim;
mod tasks;
mod token;
mod trace;
mod worker;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A durable task scheduler for GPU inference workers"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "SLUICE_LOG_FORMAT", default_value = "text")]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start here: a server, shard and GPU workers, a mixed load, live progress, a summary.
    Demo(demo::DemoArgs),
    /// Run the scheduler: HTTP API on --listen, state in --data-dir.
    Serve(serve::ServeArgs),
    /// Submit one task and print it.
    Submit(tasks::SubmitArgs),
    /// Read, list, follow or cancel tasks.
    Task {
        #[command(subcommand)]
        command: tasks::TaskCommand,
    },
    /// Issue, list and revoke bearer tokens; read the audit log.
    Token {
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// Upload, activate, roll back and list policy components; make keys and signatures.
    Policy {
        #[command(subcommand)]
        command: policy::PolicyCommand,
    },
    /// Start, read, stop and promote live A/B and shadow experiments of policy versions.
    Experiment {
        #[command(subcommand)]
        command: experiment::ExperimentCommand,
    },
    /// Run a reference worker (synthetic executor, or a vector shard with --vectors).
    Worker(worker::WorkerArgs),
    /// Submit a steady mixed load to a running server and print acknowledgement latency.
    Load(load::LoadArgs),
    /// Cut a damaged write-ahead log so the server starts again, keeping a copy of it.
    Repair(repair::RepairArgs),
    /// Write workload traces for simulations: synthetic, from a cluster's CSV, or a server's.
    Trace {
        #[command(subcommand)]
        command: trace::TraceCommand,
    },
    /// Replay a trace in virtual time with real policy components; compare two variants.
    Sim(sim::SimArgs),
    /// Measure throughput and latency; prints figures.
    Bench {
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Demo(_) | Command::Trace { .. } | Command::Sim(_) => "warn",
        // Local tools: their answer is on stdout, not in a log.
        Command::Policy {
            command: policy::PolicyCommand::Check { .. } | policy::PolicyCommand::Bench { .. },
        } => "warn",
        _ => "info",
    };
    if let Err(error) = logging::init(cli.log_format, default_level) {
        eprintln!("error: cannot start logging: {error}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => demo::run(args).await,
            Command::Serve(args) => serve::run(args).await,
            Command::Submit(args) => tasks::submit(args).await,
            Command::Task { command } => tasks::run(command).await,
            Command::Policy { command } => policy::run(command).await,
            Command::Token { command } => token::run(command).await,
            Command::Experiment { command } => experiment::run(command).await,
            Command::Worker(args) => worker::run_worker(args).await,
            Command::Load(args) => load::run(args).await,
            Command::Bench { command } => bench::run(command).await,
            Command::Repair(args) => repair::run(args),
            Command::Trace { command } => trace::run(command).await,
            Command::Sim(args) => sim::run(args),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // Its reader has read all it wanted; as for any Unix filter, that ends the command.
        Err(error) if output::is_closed_stdout(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each said once: many layers' messages already end with their
/// cause's text, which `{:#}` would repeat.
fn error_chain(error: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;
    use anyhow::Context;

    #[derive(Debug, thiserror::Error)]
    #[error("line 3: {0}")]
    struct Inner(#[source] std::io::Error);

    #[test]
    fn a_cause_already_in_its_layers_message_is_said_once() {
        let io = std::io::Error::other("disk on fire");
        let error = Err::<(), _>(Inner(io))
            .context("cannot read day.jsonl")
            .unwrap_err();
        assert_eq!(
            error_chain(&error),
            "cannot read day.jsonl: line 3: disk on fire"
        );
        let plain = anyhow::anyhow!("no such worker");
        assert_eq!(error_chain(&plain), "no such worker");
    }
}
