//! A GPU service's worker in a few lines: `cargo run -p sluice-client --example gpu_worker`
//! against a server on 127.0.0.1:7700. It depends on `sluice-client` alone.

use sluice_client::worker::{Cancel, Executor, LeaseGrant, Outcome, WorkerConfig, run};
use sluice_client::{Client, Heartbeat};
use std::sync::Arc;

struct Echo;

impl Executor for Echo {
    async fn execute(&self, grant: &LeaseGrant, _cancel: Cancel) -> Outcome {
        Outcome::Complete(serde_json::json!({ "kind": grant.task.kind }))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::new("http://127.0.0.1:7700")?;
    let heartbeat: Heartbeat = serde_json::from_value(serde_json::json!({"max_concurrency": 2}))?;
    let config = WorkerConfig::new("gpu-node-1", heartbeat);
    let stats = run(client, config, Arc::new(Echo), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    println!("{}", stats.line());
    Ok(())
}
