//! Sluice's server as a library: `server` starts it on a listener and stops it on a signal,
//! `scheduler` the threads around the engine (writer, committer, flusher, callbacks,
//! retention), `api` the HTTP routes, `auth` tokens and policy signatures, `telemetry` metrics,
//! logs and the status page's history, `replica` the PostgreSQL replicas' roles, `tls` the
//! listener's certificates, `config` the settings, `concurrency_limits` the table of limits by
//! `concurrency_key`, `experiment` the reports of live experiments, and `rollout` the guarded
//! rollouts judged step by step.

pub mod api;
pub mod auth;
pub mod collections;
pub mod concurrency_limits;
pub mod config;
pub mod experiment;
pub mod replica;
pub mod rollout;
pub mod scheduler;
pub mod server;
pub mod telemetry;
pub mod tls;
