//! `sluice bench`: benchmarks that print figures (tests assert behaviour, never timings).

mod batch;
mod child;
mod cpu;
mod e2e;
pub mod policy;
mod restart;
mod server_histograms;
mod sim;
mod skip_locked;
mod skip_locked_http;
mod submit;

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Durable submissions/s over HTTP and acknowledgement latency p50/p99 per client count.
    Submit(submit::SubmitBenchArgs),
    /// Time to reopen a store of N tasks and rebuild the in-memory indexes; disk and memory.
    Restart(restart::RestartBenchArgs),
    /// End-to-end tasks/s (submit → claim → complete over HTTP, durable) and claim latency.
    E2e(e2e::E2eBenchArgs),
    /// The same load through reference workers claiming single tasks, then GPU batches: tasks
    /// per GPU-second, waits per bucket, shares, and that no batch mixed models.
    Batch(batch::BatchBenchArgs),
    /// Cost per decision of each default policy, WASM against native; compile and swap time.
    Policy(policy::PolicyBenchArgs),
    /// The baseline for `e2e --store postgres://...`: a plain SKIP LOCKED table queue on the
    /// same PostgreSQL server, jobs/s without the engine (and without HTTP unless `--http`).
    SkipLocked(skip_locked::SkipLockedBenchArgs),
    /// The seeded mixed workload on the virtual-time driver: tasks/s of the engine's step alone.
    Sim(sim::SimBenchArgs),
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Submit(args) => submit::run(args).await,
        BenchCommand::Restart(args) => restart::run(args).await,
        BenchCommand::Policy(args) => policy::run(args).await,
        BenchCommand::E2e(args) => e2e::run(args).await,
        BenchCommand::Batch(args) => batch::run(args).await,
        BenchCommand::Sim(args) => sim::run(args).await,
        BenchCommand::SkipLocked(args) => skip_locked::run(args).await,
    }
}
