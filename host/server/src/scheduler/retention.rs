//! The retention thread: every so often asks the store to remove ended tasks (and log entries)
//! older than `retention_ms`, a bounded pass at a time, and tells the writer what went so the
//! engine's counts follow. It never takes the writer's turn: passes run beside it.

use super::{Answer, Clock, Command};
use sluice_engine::Input;
use sluice_store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Tasks one pass removes at most, so a pass holds sled's round lock for a few ms only.
const PASS_TASKS: usize = 512;
/// How often the thread looks at the closing of the scheduler while it waits.
const WAKE: Duration = Duration::from_millis(100);

/// Runs until the scheduler's command queue closes.
pub(super) fn run(
    store: Arc<dyn Store>,
    clock: Box<dyn Clock>,
    retention_ms: u64,
    commands: mpsc::Sender<Command>,
) {
    // A tenth of the retention, within 100 ms and a minute: removal lags by a tenth at most.
    let every = Duration::from_millis((retention_ms / 10).clamp(100, 60_000));
    loop {
        let mut waited = Duration::ZERO;
        while waited < every {
            if commands.is_closed() {
                return;
            }
            std::thread::sleep(WAKE.min(every - waited));
            waited += WAKE;
        }
        let cutoff_ms = clock.now_ms().saturating_sub(retention_ms);
        loop {
            let compacted = match store.compact(cutoff_ms, PASS_TASKS) {
                Ok(compacted) => compacted,
                Err(error) => {
                    tracing::warn!(%error, "retention pass failed; it is tried again later");
                    break;
                }
            };
            if compacted.tasks > 0 {
                tracing::debug!(
                    tasks = compacted.tasks,
                    blocks = compacted.event_blocks,
                    "retention removed ended tasks"
                );
                let forgotten = Command::Step {
                    input: Input::Forgotten {
                        tasks_by_state: compacted.tasks_by_state,
                    },
                    answer: Answer::Done(None),
                };
                if commands.blocking_send(forgotten).is_err() {
                    return;
                }
            }
            if !compacted.more {
                break;
            }
            // Between passes the materializer gets its turn.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
