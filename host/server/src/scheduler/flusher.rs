//! Group commit: one thread calls `sync` for every write that arrived while the last one ran,
//! then answers all of their requests. (the default backend's flush stalls with many concurrent
//! callers, so only this thread ever flushes.)

use crate::telemetry::PipelineMetrics;
use sluice_store::{Store, StoreError};
use std::sync::Arc;
use std::sync::mpsc::Receiver;

/// An answer to send once the write before it is durable, or to fail if the sync failed.
pub(crate) type Delivery = Box<dyn FnOnce(Result<(), Arc<StoreError>>) + Send>;

/// Deliveries answered by one sync at most; bounds the time the first one waits behind the rest.
const MAX_GROUP: usize = 16_384;

pub(crate) fn run(store: &dyn Store, inbox: Receiver<Delivery>, metrics: &PipelineMetrics) {
    let mut group: Vec<Delivery> = Vec::new();
    while let Ok(first) = inbox.recv() {
        group.push(first);
        while group.len() < MAX_GROUP {
            match inbox.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        // Every write in `group` was committed before it was sent here, so this sync covers it.
        let started = std::time::Instant::now();
        let outcome = store.sync().map_err(Arc::new);
        metrics.observe_sync(started.elapsed().as_secs_f64());
        if let Err(error) = &outcome {
            tracing::error!(%error, "sync failed; answering the waiting requests with an error");
        }
        for delivery in group.drain(..) {
            delivery(outcome.clone());
        }
    }
    // The writer has stopped: make whatever it committed last durable before exiting.
    if let Err(error) = store.sync() {
        tracing::error!(%error, "final sync failed");
    }
}
