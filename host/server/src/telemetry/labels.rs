//! Bounded label values: the first values seen keep their names, later ones become `other`,
//! so a device fleet or a worker's free-text failure messages cannot grow a family without
//! bound.

use std::collections::HashSet;
use std::sync::Mutex;

pub const OTHER: &str = "other";

/// The longest label value kept, in characters; longer ones are cut.
const MAX_VALUE_CHARS: usize = 64;

#[derive(Debug)]
pub struct LabelBudget {
    max_values: usize,
    seen: Mutex<HashSet<String>>,
}

impl LabelBudget {
    pub fn new(max_values: usize) -> Self {
        LabelBudget {
            max_values,
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// `value` itself while it is one of the first `max_values` distinct values, else `other`.
    pub fn label(&self, value: &str) -> String {
        let value = truncate(value);
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&value) {
            return value;
        }
        if seen.len() < self.max_values {
            seen.insert(value.clone());
            return value;
        }
        OTHER.to_owned()
    }
}

fn truncate(value: &str) -> String {
    value.chars().take(MAX_VALUE_CHARS).collect()
}

/// The stable part of a failure message: its first line, each run of digits as `#` (so
/// "GPU 3 lost after 1200 ms" and "GPU 5 lost after 80 ms" are one reason), cut to length.
pub fn failure_reason(message: &str) -> String {
    let first_line = message.lines().next().unwrap_or("").trim();
    let mut reason = String::with_capacity(first_line.len().min(MAX_VALUE_CHARS));
    let mut in_digits = false;
    for c in first_line.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                reason.push('#');
            }
            in_digits = true;
        } else {
            reason.push(c);
            in_digits = false;
        }
        if reason.chars().count() >= MAX_VALUE_CHARS {
            break;
        }
    }
    if reason.is_empty() {
        "unspecified".to_owned()
    } else {
        reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_past_the_budget_become_other_and_known_ones_keep_their_name() {
        let budget = LabelBudget::new(2);
        assert_eq!(budget.label("a"), "a");
        assert_eq!(budget.label("b"), "b");
        assert_eq!(budget.label("c"), OTHER);
        assert_eq!(budget.label("a"), "a");
        let roomy = LabelBudget::new(10);
        assert_eq!(
            roomy.label(&"x".repeat(100)).chars().count(),
            MAX_VALUE_CHARS
        );
    }

    #[test]
    fn reasons_that_differ_only_in_numbers_are_one_reason() {
        assert_eq!(
            failure_reason("GPU 3 lost after 1200 ms\nstack..."),
            failure_reason("GPU 5 lost after 80 ms")
        );
        assert_eq!(failure_reason("GPU 3 lost"), "GPU # lost");
        assert_eq!(failure_reason("  "), "unspecified");
        assert!(failure_reason(&"y".repeat(500)).chars().count() <= MAX_VALUE_CHARS);
    }
}
