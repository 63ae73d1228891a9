//! The callback deliverer: a thread of its own with a small async runtime that POSTs terminal
//! tasks to their `callback_url`s, a bounded number at a time, and tells the writer how each
//! attempt went. It never blocks the writer: jobs arrive through a bounded queue (a full queue
//! defers the attempt to its retry time), and an answer that cannot be handed back is simply
//! retried later, since delivery is at least once.

use super::{Answer, Command};
use crate::engine::{CALLBACK_ATTEMPT_TIMEOUT_MS, CallbackJob as Job, CallbackOutcome, Input};
use crate::model::CallbackAllow;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};

/// Deliveries in flight at once.
const MAX_IN_FLIGHT: usize = 16;
/// Jobs waiting for a slot at most.
pub(crate) const QUEUE_CAPACITY: usize = 1_024;

/// Starts the deliverer; it stops when every job sender is gone.
pub(crate) fn spawn(
    commands: mpsc::Sender<Command>,
    allow: CallbackAllow,
) -> std::io::Result<mpsc::Sender<Job>> {
    let (jobs, mut inbox) = mpsc::channel::<Job>(QUEUE_CAPACITY);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(CALLBACK_ATTEMPT_TIMEOUT_MS / 2))
        .redirect(reqwest::redirect::Policy::none())
        .dns_resolver(Arc::new(CheckedResolver { allow }))
        .build()
        .map_err(std::io::Error::other)?;
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
                    tokio::spawn(async move {
                        let outcome = deliver(&http, &job).await;
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
    Ok(jobs)
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
