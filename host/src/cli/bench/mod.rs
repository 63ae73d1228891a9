//! `sluice bench`: benchmarks that print figures (tests assert behaviour, never timings).

mod child;
mod restart;
mod submit;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Durable submissions/s over HTTP and acknowledgement latency p50/p99 per client count.
    Submit(submit::SubmitBenchArgs),
    /// Time to reopen a store of N tasks and rebuild the in-memory indexes; disk and memory.
    Restart(restart::RestartBenchArgs),
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Submit(args) => submit::run(args).await,
        BenchCommand::Restart(args) => restart::run(args).await,
    }
}
