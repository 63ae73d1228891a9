//! The shard worker's executor: a `vector.search` child's payload in, its nearest hits out. A
//! payload it cannot read or a child for data it does not hold fails as `invalid-input`, which
//! no retry can fix, so the parent learns at once that the shard is missing.

use super::ShardIndex;
use sluice_client::worker::{Cancel, Executor, LeaseGrant, Outcome};
use sluice_model::{FailureClass, ShardQuery};
use std::sync::Arc;

pub struct VectorExecutor {
    pub index: Arc<ShardIndex>,
    /// Added before each search: a stand-in for a slower device in demos and tests.
    pub delay_ms: u64,
}

impl Executor for VectorExecutor {
    /// A shard search takes milliseconds: it runs to its end even when cancelled, and the
    /// worker then reports `stopped`.
    async fn execute(&self, grant: &LeaseGrant, _cancel: Cancel) -> Outcome {
        let invalid = |message: String| Outcome::Fail {
            class: FailureClass::InvalidInput,
            message,
        };
        let Some(payload) = &grant.payload else {
            return invalid("a vector.search child needs a payload".into());
        };
        let query: ShardQuery = match serde_json::from_str(payload.get()) {
            Ok(query) => query,
            Err(error) => return invalid(format!("not a shard query: {error}")),
        };
        if self.delay_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(self.delay_ms)).await;
        }
        let index = self.index.clone();
        // The scan is CPU work: off the async threads, so heartbeats keep their lease.
        let searched = tokio::task::spawn_blocking(move || index.search(&query)).await;
        match searched {
            Ok(Ok(answer)) => match serde_json::to_value(answer) {
                Ok(value) => Outcome::Complete(value),
                Err(error) => invalid(format!("cannot encode the answer: {error}")),
            },
            Ok(Err(error)) => invalid(error.to_string()),
            Err(error) => Outcome::Fail {
                class: FailureClass::Transient,
                message: format!("the search stopped: {error}"),
            },
        }
    }
}
