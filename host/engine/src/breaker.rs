//! A worker's circuit breaker: closed while its recent outcomes are healthy, open (no claims)
//! for a cool-down after too many failures, then half-open with one probe task whose outcome
//! closes it or opens it again for twice as long.

use serde::Serialize;
use sluice_model::TaskId;
use std::collections::VecDeque;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerOptions {
    /// Outcomes remembered: the sliding window.
    pub window: usize,
    /// Failures in the window needed before the ratio counts.
    pub min_failures: usize,
    pub failure_ratio_pct: u32,
    pub consecutive_failures: u32,
    pub cooldown_ms: u64,
    /// The cool-down doubles with each open in a row, up to this.
    pub max_cooldown_ms: u64,
}

impl Default for BreakerOptions {
    fn default() -> Self {
        BreakerOptions {
            window: 20,
            min_failures: 5,
            failure_ratio_pct: 50,
            consecutive_failures: 5,
            cooldown_ms: 30_000,
            max_cooldown_ms: 600_000,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum BreakerState {
    Closed,
    Open { until_ms: u64 },
    HalfOpen { probe: Option<TaskId> },
}

impl BreakerState {
    pub fn name(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

/// A change of state, to be logged as a worker event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerChange {
    pub from: &'static str,
    pub to: &'static str,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breaker {
    state: BreakerState,
    /// Recent outcomes, newest last: true for a failure.
    window: VecDeque<bool>,
    consecutive_failures: u32,
    /// Opens since the breaker was last closed, for the doubling cool-down.
    opens_in_a_row: u32,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            state: BreakerState::Closed,
            window: VecDeque::new(),
            consecutive_failures: 0,
            opens_in_a_row: 0,
        }
    }
}

/// How many tasks a breaker lets a worker claim now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowance {
    Any,
    /// Half-open: one probe task.
    Probe,
    /// Open, or half-open with its probe out.
    None {
        until_ms: Option<u64>,
    },
}

impl Breaker {
    pub fn state(&self) -> BreakerState {
        self.state
    }

    /// What the worker may claim at `now_ms`; an open breaker whose cool-down has passed turns
    /// half-open here.
    pub fn allowance(&mut self, now_ms: u64) -> (Allowance, Option<BreakerChange>) {
        match self.state {
            BreakerState::Closed => (Allowance::Any, None),
            BreakerState::Open { until_ms } if now_ms < until_ms => (
                Allowance::None {
                    until_ms: Some(until_ms),
                },
                None,
            ),
            BreakerState::Open { .. } => {
                self.state = BreakerState::HalfOpen { probe: None };
                let change = BreakerChange {
                    from: "open",
                    to: "half_open",
                    reason: "cool-down over: one probe task".into(),
                };
                (Allowance::Probe, Some(change))
            }
            BreakerState::HalfOpen { probe: None } => (Allowance::Probe, None),
            BreakerState::HalfOpen { probe: Some(_) } => (Allowance::None { until_ms: None }, None),
        }
    }

    /// Forgets a probe that ended without an outcome (cancelled, say), so the worker can be
    /// probed again.
    pub fn probe_ended(&mut self, task: TaskId) {
        if self.state == (BreakerState::HalfOpen { probe: Some(task) }) {
            self.state = BreakerState::HalfOpen { probe: None };
        }
    }

    /// Marks `task` as the half-open breaker's probe.
    pub fn probing(&mut self, task: TaskId) {
        if let BreakerState::HalfOpen { probe } = &mut self.state {
            *probe = Some(task);
        }
    }

    /// Records the outcome of `task` on this worker.
    pub fn record(
        &mut self,
        now_ms: u64,
        task: TaskId,
        failed: bool,
        options: &BreakerOptions,
    ) -> Option<BreakerChange> {
        self.window.push_back(failed);
        while self.window.len() > options.window.max(1) {
            self.window.pop_front();
        }
        self.consecutive_failures = if failed {
            self.consecutive_failures.saturating_add(1)
        } else {
            0
        };
        match self.state {
            BreakerState::HalfOpen { probe } if probe == Some(task) => {
                if failed {
                    Some(self.open(now_ms, "the probe task failed".into(), options))
                } else {
                    self.close("the probe task succeeded")
                }
            }
            BreakerState::Closed => {
                let failures = self.window.iter().filter(|&&f| f).count();
                let ratio_pct = failures * 100 / self.window.len().max(1);
                if self.consecutive_failures >= options.consecutive_failures {
                    let reason = format!("{} failures in a row", self.consecutive_failures);
                    Some(self.open(now_ms, reason, options))
                } else if failures >= options.min_failures
                    && ratio_pct >= options.failure_ratio_pct as usize
                {
                    let reason = format!(
                        "{failures} of the last {} outcomes failed",
                        self.window.len()
                    );
                    Some(self.open(now_ms, reason, options))
                } else {
                    None
                }
            }
            // Outcomes of tasks claimed before it opened do not move an open breaker.
            _ => None,
        }
    }

    /// Closes the breaker by hand.
    pub fn reset(&mut self) -> Option<BreakerChange> {
        self.close("reset by hand")
    }

    fn open(&mut self, now_ms: u64, reason: String, options: &BreakerOptions) -> BreakerChange {
        let from = self.state.name();
        let doublings = self.opens_in_a_row.min(32);
        let cooldown_ms = options
            .cooldown_ms
            .saturating_mul(1u64 << doublings)
            .min(options.max_cooldown_ms.max(options.cooldown_ms));
        self.opens_in_a_row = self.opens_in_a_row.saturating_add(1);
        self.state = BreakerState::Open {
            until_ms: now_ms.saturating_add(cooldown_ms),
        };
        BreakerChange {
            from,
            to: "open",
            reason: format!("{reason}; cool-down {cooldown_ms} ms"),
        }
    }

    fn close(&mut self, reason: &str) -> Option<BreakerChange> {
        let from = self.state.name();
        self.window.clear();
        self.consecutive_failures = 0;
        self.opens_in_a_row = 0;
        if self.state == BreakerState::Closed {
            return None;
        }
        self.state = BreakerState::Closed;
        Some(BreakerChange {
            from,
            to: "closed",
            reason: reason.into(),
        })
    }
}
