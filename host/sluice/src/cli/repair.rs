//! `sluice repair`: when `serve` refuses a data directory because its write-ahead log is
//! damaged (it names the file and the offset), this cuts the log at the damage after copying it,
//! so that the server starts with everything before the damage.

use anyhow::Context;
use sluice_store_sled::SledStore;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct RepairArgs {
    /// The data directory, as given to `serve` (the server must not be running)
    #[arg(long, env = "SLUICE_DATA_DIR", default_value = "./sluice-data")]
    data_dir: PathBuf,
}

pub fn run(args: RepairArgs) -> anyhow::Result<()> {
    let repair = SledStore::repair(&args.data_dir)
        .with_context(|| format!("cannot repair {}", args.data_dir.display()))?;
    println!("copied the write-ahead log to {}", repair.copy.display());
    if repair.cuts.is_empty() {
        println!("the log was sound: nothing was cut");
    }
    for cut in &repair.cuts {
        println!("cut: {cut}");
    }
    Ok(())
}
