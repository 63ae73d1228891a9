//! The task state machine: one table of legal transitions, checked by every change of state.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum State {
    Created,
    Queued,
    Claimed,
    Running,
    RetryWait,
    Split,
    Merging,
    Completed,
    Failed,
    Dead,
    Cancelled,
    TimedOut,
}

use State::*;

/// Every legal transition; anything not listed is refused. Nothing moves backwards except
/// RetryWait → Queued, which only the retry decision reaches (seed 000: a Running → Queued
/// shortcut deadlocked a cluster). Terminal states have no successors.
const TRANSITIONS: [(State, &[State]); 12] = [
    (Created, &[Queued, Failed, Cancelled]),
    (Queued, &[Claimed, Split, Cancelled, TimedOut]),
    (Claimed, &[Running, RetryWait, Dead, Cancelled, TimedOut]),
    (
        Running,
        &[Completed, RetryWait, Failed, Dead, Cancelled, TimedOut],
    ),
    (RetryWait, &[Queued, Dead, Cancelled, TimedOut]),
    (Split, &[Merging, Failed, Cancelled, TimedOut]),
    (Merging, &[Completed, Failed]),
    (Completed, &[]),
    (Failed, &[]),
    (Dead, &[]),
    (Cancelled, &[]),
    (TimedOut, &[]),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {from} → {to}")]
pub struct IllegalTransition {
    pub from: State,
    pub to: State,
}

impl State {
    pub const ALL: [State; 12] = [
        Created, Queued, Claimed, Running, RetryWait, Split, Merging, Completed, Failed, Dead,
        Cancelled, TimedOut,
    ];

    pub fn successors(self) -> &'static [State] {
        TRANSITIONS[self.code() as usize].1
    }

    pub fn is_terminal(self) -> bool {
        self.successors().is_empty()
    }

    pub fn check(self, to: State) -> Result<(), IllegalTransition> {
        if self.successors().contains(&to) {
            Ok(())
        } else {
            Err(IllegalTransition { from: self, to })
        }
    }

    /// A stable one-byte code, used in storage keys. Never renumber.
    pub fn code(self) -> u8 {
        self as u8
    }

    pub fn from_code(code: u8) -> Option<State> {
        Self::ALL.get(usize::from(code)).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Created => "created",
            Queued => "queued",
            Claimed => "claimed",
            Running => "running",
            RetryWait => "retry_wait",
            Split => "split",
            Merging => "merging",
            Completed => "completed",
            Failed => "failed",
            Dead => "dead",
            Cancelled => "cancelled",
            TimedOut => "timed_out",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|s| s.as_str() == text)
            .ok_or_else(|| format!("unknown state `{text}`"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of DESIGN.md §3, written out independently of TRANSITIONS so that a slip in
    /// either one fails this test.
    fn expected_legal(from: State, to: State) -> bool {
        matches!(
            (from, to),
            (Created, Queued | Failed | Cancelled)
                | (Queued, Claimed | Split | Cancelled | TimedOut)
                | (Claimed, Running | RetryWait | Dead | Cancelled | TimedOut)
                | (
                    Running,
                    Completed | RetryWait | Failed | Dead | Cancelled | TimedOut
                )
                | (RetryWait, Queued | Dead | Cancelled | TimedOut)
                | (Split, Merging | Failed | Cancelled | TimedOut)
                | (Merging, Completed | Failed)
        )
    }

    #[test]
    fn every_pair_of_states_is_legal_exactly_when_the_design_table_says_so() {
        let mut legal = 0;
        for from in State::ALL {
            for to in State::ALL {
                let verdict = from.check(to);
                if expected_legal(from, to) {
                    assert_eq!(verdict, Ok(()), "{from} → {to} should be legal");
                    legal += 1;
                } else {
                    assert_eq!(
                        verdict,
                        Err(IllegalTransition { from, to }),
                        "{from} → {to}"
                    );
                }
            }
        }
        assert_eq!(legal, 28);
    }

    #[test]
    fn terminal_states_never_change() {
        let terminal: Vec<State> = State::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal, [Completed, Failed, Dead, Cancelled, TimedOut]);
        for from in terminal {
            assert!(State::ALL.iter().all(|&to| from.check(to).is_err()));
        }
    }

    #[test]
    fn codes_names_and_table_rows_line_up() {
        for (i, (state, _)) in TRANSITIONS.iter().enumerate() {
            assert_eq!(state.code() as usize, i);
            assert_eq!(State::from_code(state.code()), Some(*state));
            assert_eq!(state.as_str().parse::<State>(), Ok(*state));
            let json = serde_json::to_string(state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert_eq!(State::from_code(12), None);
    }
}
