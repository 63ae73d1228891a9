//! `sluice bench sim`: the seeded mixed workload on the virtual-time driver — how fast the
//! engine's step runs with no HTTP, no disk and no clock, and a digest of the transcript so two
//! runs of one seed can be compared by eye.

use anyhow::bail;
use sha2::{Digest, Sha256};
use sluice_engine::sim::workload::{self, Workload};
use std::time::Instant;

#[derive(clap::Args)]
pub struct SimBenchArgs {
    /// Submissions in the run (a vector search counts once).
    #[arg(long, default_value_t = 100_000)]
    tasks: usize,
    /// The seed: the same seed gives the same transcript, byte for byte.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

pub async fn run(args: SimBenchArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.tasks > 10_000_000 {
        bail!("--tasks must be 1 to 10000000");
    }
    let workload = Workload::mixed(args.seed, args.tasks);
    let started = Instant::now();
    let outcome = tokio::task::spawn_blocking(move || workload::run(&workload)).await?;
    let wall_s = started.elapsed().as_secs_f64();
    let tasks: usize = outcome.states.values().sum();
    let events = outcome.transcript.lines().count();
    let digest = Sha256::digest(outcome.transcript.as_bytes());
    let digest: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    println!(
        "simulated {} submissions ({tasks} tasks with shard children) over {:.0} s of virtual time in {wall_s:.2} s: {:.0} tasks/s of wall time, {:.0}× real time",
        args.tasks,
        outcome.virtual_ms as f64 / 1_000.0,
        tasks as f64 / wall_s,
        outcome.virtual_ms as f64 / 1_000.0 / wall_s,
    );
    println!(
        "{events} transcript lines, sha256 {digest}…; every task ended: {}",
        outcome.drained
    );
    for (state, count) in &outcome.states {
        println!("  {state:<10} {count}");
    }
    Ok(())
}
