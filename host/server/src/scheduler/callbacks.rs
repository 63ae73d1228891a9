//! The callback deliverer: a thread of its own with a small async runtime that POSTs terminal
//! tasks to their `callback_url`s, a bounded number at a time, and tells the writer how each
//! attempt went. It never blocks the writer: jobs arrive through a queue bounded in jobs and in
//! bytes (`Outbox`: the writer plans only what it has room for, and the rest stays due), and
//! an answer that cannot be handed back is simply retried later, since delivery is at least
//! once. Jobs are handed over only once the commit that marked them is synced, so a receiver is
//! never told of an end that a crash could still undo.

use super::{Answer, Command};
use sluice_engine::{CALLBACK_ATTEMPT_TIMEOUT_MS, CallbackJob as Job, CallbackOutcome, Input};
use sluice_model::CallbackAllow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};

/// Deliveries in flight at once.
const MAX_IN_FLIGHT: usize = 16;
/// Jobs planned and not yet delivered (queued, or in flight), at most.
pub(crate) const QUEUE_CAPACITY: usize = 1_024;
/// Bytes of their bodies at most. A body carries its task's result (up to `max_result_bytes`),
/// so the count alone would allow a gibibyte; a job larger than this still goes, alone.
pub(crate) const QUEUE_BYTES: usize = 64 << 20;

/// The writer's end of the deliverer's queue: what it may still plan, and the hand-over.
#[derive(Clone)]
pub(crate) struct Outbox {
    jobs: mpsc::Sender<Job>,
    planned: Arc<PlannedDelivery>,
}

/// Jobs planned and not yet delivered, and the bytes of their bodies.
#[derive(Default)]
struct PlannedDelivery {
    jobs: AtomicUsize,
    bytes: AtomicUsize,
}

impl PlannedDelivery {
    fn release(&self, bytes: usize) {
        self.jobs.fetch_sub(1, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

impl Outbox {
    /// How many more jobs, and bytes of bodies, a tick may plan now (any size when none is
    /// waiting, so a body over the byte bound is not held back for ever).
    pub(crate) fn room(&self) -> (usize, usize) {
        let jobs = self.planned.jobs.load(Ordering::Acquire);
        let bytes = self.planned.bytes.load(Ordering::Acquire);
        let room_bytes = if jobs == 0 {
            usize::MAX
        } else {
            QUEUE_BYTES.saturating_sub(bytes)
        };
        (QUEUE_CAPACITY.saturating_sub(jobs), room_bytes)
    }

    /// Counts a job the writer has planned, before its commit is synced.
    pub(crate) fn plan(&self, job: &Job) {
        self.planned.jobs.fetch_add(1, Ordering::AcqRel);
        self.planned
            .bytes
            .fetch_add(job.body.len(), Ordering::AcqRel);
    }

    /// Hands a planned job over (its commit is synced), or lets it go when `deliver` is false
    /// (the commit failed): the attempt is then retried once its timeout passes.
    pub(crate) fn hand_over(&self, job: Job, deliver: bool) {
        let bytes = job.body.len();
        if !deliver {
            self.planned.release(bytes);
            return;
        }
        // Room was counted when it was planned: the queue holds every planned job.
        if let Err(error) = self.jobs.try_send(job) {
            tracing::warn!(%error, "the callback deliverer has stopped; the callback is retried later");
            self.planned.release(bytes);
        }
    }
}

/// Starts the deliverer; it stops when every `Outbox` is gone.
pub(crate) fn spawn(
    commands: mpsc::Sender<Command>,
    allow: CallbackAllow,
    roots: &[reqwest::Certificate],
) -> std::io::Result<Outbox> {
    let (jobs, mut inbox) = mpsc::channel::<Job>(QUEUE_CAPACITY);
    let planned = Arc::new(PlannedDelivery::default());
    let outbox = Outbox {
        jobs,
        planned: planned.clone(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // https over rustls, with the system's roots and any the configuration adds.
    let mut http = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(Duration::from_millis(CALLBACK_ATTEMPT_TIMEOUT_MS / 2))
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(CheckedResolver { allow }));
    for root in roots {
        http = http.add_root_certificate(root.clone());
    }
    let http = http.build().map_err(std::io::Error::other)?;
    std::thread::Builder::new()
        .name("sluice-callbacks".into())
        .spawn(move || {
            runtime.block_on(async move {
                let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
                while let Some(job) = inbox.recv().await {
                    let Ok(slot) = slots.clone().acquire_owned().await else {
                        break;
                    };
                    let http = http.clone();
                    let commands = commands.clone();
                    let planned = planned.clone();
                    tokio::spawn(async move {
                        let outcome = deliver(&http, &job).await;
                        planned.release(job.body.len());
                        // A full or closed queue loses only this answer: the attempt is
                        // retried once its timeout passes.
                        let _ = commands.try_send(Command::Step {
                            input: Input::CallbackDone {
                                id: job.id,
                                attempt: job.attempt,
                                outcome,
                            },
                            answer: Answer::Done(None),
                        });
                        drop(slot);
                    });
                }
            });
        })?;
    Ok(outbox)
}

async fn deliver(http: &reqwest::Client, job: &Job) -> CallbackOutcome {
    let sent = http
        .post(&job.url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("sluice-callback-attempt", job.attempt.to_string())
        .body(job.body.clone())
        .send()
        .await;
    match sent {
        Ok(response) if response.status().is_success() => CallbackOutcome::Delivered {
            status: response.status().as_u16(),
        },
        Ok(response) => CallbackOutcome::Failed {
            reason: format!("HTTP {}", response.status().as_u16()),
        },
        Err(error) => CallbackOutcome::Failed {
            reason: error.to_string().chars().take(200).collect(),
        },
    }
}

/// Resolves a callback's host and keeps only the addresses a callback may reach, so a name that
/// resolves to a loopback or private address (or is made to, later) is refused like the
/// address itself would have been at submission.
struct CheckedResolver {
    allow: CallbackAllow,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let permitted: Vec<std::net::SocketAddr> = found
                .filter(|address| allow.permits(&host, address.ip()))
                .collect();
            if permitted.is_empty() {
                return Err(format!(
                    "{host} resolves only to loopback, private or link-local addresses; \
                     `callback_allow` must name it"
                )
                .into());
            }
            let addresses: reqwest::dns::Addrs = Box::new(permitted.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::dns::Resolve;

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_allowed() {
        let refused = CheckedResolver {
            allow: CallbackAllow::default(),
        };
        let name = || "localhost".parse::<reqwest::dns::Name>().unwrap();
        let error = refused.resolve(name()).await.err().expect("refused");
        assert!(error.to_string().contains("callback_allow"), "{error}");
        let allowed = CheckedResolver {
            allow: CallbackAllow::parse(&["127.0.0.0/8".into(), "::1".into()]).unwrap(),
        };
        let addresses: Vec<_> = allowed.resolve(name()).await.unwrap().collect();
        assert!(!addresses.is_empty());
        assert!(
            addresses.iter().all(|a| a.ip().is_loopback()),
            "{addresses:?}"
        );
    }
}
