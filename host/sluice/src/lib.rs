//! The `sluice` command's library half: what only the command uses, kept out of the server.
//! `replay` runs a trace through the engine on virtual time with the real policy components,
//! `trace` reads, writes, generates and imports workload traces, and `vector` is exact vector
//! search over a shard of a collection for `sluice worker --vectors`. The command itself
//! (`main.rs`, `cli/`) is a thin layer over these and the workspace's other crates.

pub mod replay;
pub mod trace;
pub mod vector;
