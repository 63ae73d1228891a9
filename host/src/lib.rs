//! Sluice: a durable task scheduler between submitting devices and GPU inference workers.
//!
//! `model` holds the task model and its state machine, `engine` the deterministic core,
//! `store` durable storage behind a trait, `scheduler` the threads that connect them, `api`
//! the HTTP routes, `auth` tokens and policy signatures, `server` the server as a library, `client` a typed HTTP client, `worker` a worker client to embed, `vector` exact vector search
//! for shard workers, `trace` workload traces for simulations, `experiment` the reports of live experiments. The `sluice`
//! command (`main.rs`, `cli/`) is a thin layer over them.

pub mod api;
pub mod auth;
pub mod client;
pub mod concurrency_limits;
pub mod config;
pub mod engine;
pub mod experiment;
pub mod model;
pub mod policy;
pub mod replay;
pub mod replica;
pub mod scheduler;
pub mod server;
pub mod sim;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod trace;
pub mod vector;
pub mod worker;
