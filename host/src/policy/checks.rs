//! What the host can use from a policy's answer. The same checks judge the conformance cases
//! at upload and every live decision, so a module that answers nonsense later (an index out
//! of range, a delay past the bound) is treated as faulting, exactly like one that traps.

use super::bindings::{aging, merge, priority, retry, split};
use aging::exports::sluice::policy::aging::Promotion;
use merge::exports::sluice::policy::merge::{Hit, Part};
use priority::exports::sluice::policy::priority::Admission;
use retry::exports::sluice::policy::retry::{Decision, ErrorClass, Failure};
use split::exports::sluice::policy::split::{ShardFilter, Subtask};

/// The longest retry delay a policy may ask for.
pub const MAX_RETRY_DELAY_MS: u64 = 24 * 3_600_000;
/// The longest attempt timeout an admission may set.
pub const MAX_ATTEMPT_TIMEOUT_MS: u64 = 365 * 24 * 3_600_000;
/// The most children one split may make.
pub const MAX_CHILDREN: usize = 1024;
/// The most centroids one child's filter may list.
pub const MAX_CENTROIDS: usize = 65_536;
/// The longest reason (for a dead task or a refused split or merge) kept from a policy.
pub const MAX_REASON_BYTES: usize = 1024;

fn same_length(answers: usize, asked: usize, what: &str) -> Result<(), String> {
    if answers == asked {
        Ok(())
    } else {
        Err(format!("answered {answers} {what} for {asked} inputs"))
    }
}

fn reason(text: &str, what: &str) -> Result<(), String> {
    if text.len() <= MAX_REASON_BYTES {
        Ok(())
    } else {
        Err(format!("{what} reason is over {MAX_REASON_BYTES} bytes"))
    }
}

pub fn bucket_weights(weights: &[u32]) -> Result<(), String> {
    if weights.len() != 3 {
        return Err(format!(
            "bucket-weights gave {} weights, not 3",
            weights.len()
        ));
    }
    if weights.iter().all(|&w| w == 0) || weights.iter().any(|&w| w > 1_000_000) {
        return Err("bucket-weights must each be 0 to 1000000 and not all 0".into());
    }
    Ok(())
}

pub fn admissions(asked: usize, answer: &[Admission]) -> Result<(), String> {
    same_length(answer.len(), asked, "admissions")?;
    match answer
        .iter()
        .position(|a| !(1..=MAX_ATTEMPT_TIMEOUT_MS).contains(&a.attempt_timeout_ms))
    {
        Some(i) => Err(format!(
            "admission {i} has attempt-timeout-ms {}, outside 1..={MAX_ATTEMPT_TIMEOUT_MS}",
            answer[i].attempt_timeout_ms
        )),
        None => Ok(()),
    }
}

fn urgency(bucket: aging::sluice::policy::types::Bucket) -> u8 {
    use aging::sluice::policy::types::Bucket;
    match bucket {
        Bucket::Urgent => 2,
        Bucket::Normal => 1,
        Bucket::Low => 0,
    }
}

pub fn promotions(
    waiting: &[aging::sluice::policy::types::TaskView],
    answer: &[Promotion],
) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for promotion in answer {
        let Some(task) = waiting.get(promotion.index as usize) else {
            return Err(format!(
                "promotion index {} is out of range ({} waiting)",
                promotion.index,
                waiting.len()
            ));
        };
        if !seen.insert(promotion.index) {
            return Err(format!("index {} is promoted twice", promotion.index));
        }
        if urgency(promotion.to) <= urgency(task.bucket) {
            return Err(format!(
                "index {} is moved to {:?}, which is not above its bucket {:?}",
                promotion.index, promotion.to, task.bucket
            ));
        }
    }
    Ok(())
}

pub fn decisions(failures: &[Failure], answer: &[Decision]) -> Result<(), String> {
    same_length(answer.len(), failures.len(), "decisions")?;
    for (i, (failure, decision)) in failures.iter().zip(answer).enumerate() {
        match decision {
            Decision::RetryAfterMs(delay) if *delay > MAX_RETRY_DELAY_MS => {
                return Err(format!(
                    "decision {i} retries after {delay} ms, past the {MAX_RETRY_DELAY_MS} ms bound"
                ));
            }
            Decision::RetryAfterMs(_)
                if matches!(
                    failure.class,
                    ErrorClass::Permanent | ErrorClass::InvalidInput
                ) =>
            {
                return Err(format!(
                    "decision {i} retries a {:?} failure, which must be dead",
                    failure.class
                ));
            }
            Decision::RetryAfterMs(_) if failure.task.attempt >= failure.max_attempts => {
                return Err(format!(
                    "decision {i} retries attempt {} of at most {}",
                    failure.task.attempt, failure.max_attempts
                ));
            }
            Decision::RetryAfterMs(_) => {}
            Decision::Dead(text) => reason(text, "a dead decision's")?,
        }
    }
    Ok(())
}

pub fn subtasks(answer: &Result<Vec<Subtask>, String>) -> Result<(), String> {
    let children = match answer {
        Ok(children) => children,
        Err(refusal) => return reason(refusal, "a split refusal's"),
    };
    if children.is_empty() || children.len() > MAX_CHILDREN {
        return Err(format!(
            "split into {} children; 1 to {MAX_CHILDREN} are allowed",
            children.len()
        ));
    }
    for (i, child) in children.iter().enumerate() {
        if !child.weight.is_finite() || child.weight < 0.0 {
            return Err(format!("child {i} has weight {}", child.weight));
        }
        let filter_ok = match &child.filter {
            ShardFilter::Shard(_) => true,
            ShardFilter::IdRange((low, high)) => low < high,
            ShardFilter::IdHash((bucket, of)) => bucket < of,
            ShardFilter::Centroids(list) => !list.is_empty() && list.len() <= MAX_CENTROIDS,
        };
        if !filter_ok {
            return Err(format!("child {i} has an empty or malformed filter"));
        }
    }
    Ok(())
}

pub fn merged(k: u32, parts: &[Part], answer: &Result<Vec<Hit>, String>) -> Result<(), String> {
    let hits = match answer {
        Ok(hits) => hits,
        Err(refusal) => return reason(refusal, "a merge refusal's"),
    };
    if hits.len() > k as usize {
        return Err(format!("merged {} hits for k = {k}", hits.len()));
    }
    let known: std::collections::BTreeSet<u64> = parts
        .iter()
        .flat_map(|p| p.hits.iter().map(|h| h.id))
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for (i, hit) in hits.iter().enumerate() {
        if hit.distance.is_nan() {
            return Err(format!("hit {i} has a NaN distance"));
        }
        if !known.contains(&hit.id) {
            return Err(format!("hit {i} (id {}) is in no part", hit.id));
        }
        if !ids.insert(hit.id) {
            return Err(format!("id {} is merged twice", hit.id));
        }
        if let Some(before) = i.checked_sub(1).map(|j| &hits[j])
            && (before.distance, before.id) > (hit.distance, hit.id)
        {
            return Err(format!("hit {i} is out of order (by distance, then id)"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_answer_must_be_sorted_unique_bounded_and_from_the_parts() {
        let hit = |id, distance| Hit { id, distance };
        let parts = [Part {
            child: 0,
            weight: 1.0,
            hits: vec![hit(1, 0.1), hit(2, 0.2), hit(3, 0.2)],
        }];
        assert!(merged(3, &parts, &Ok(vec![hit(1, 0.1), hit(2, 0.2), hit(3, 0.2)])).is_ok());
        assert!(merged(2, &parts, &Ok(vec![hit(1, 0.1), hit(2, 0.2), hit(3, 0.2)])).is_err());
        assert!(merged(3, &parts, &Ok(vec![hit(2, 0.2), hit(1, 0.1)])).is_err());
        assert!(merged(3, &parts, &Ok(vec![hit(3, 0.2), hit(2, 0.2)])).is_err());
        assert!(merged(3, &parts, &Ok(vec![hit(1, 0.1), hit(1, 0.1)])).is_err());
        assert!(merged(3, &parts, &Ok(vec![hit(9, 0.0)])).is_err());
        assert!(merged(3, &parts, &Err("no parts".into())).is_ok());
    }

    #[test]
    fn a_retry_answer_must_respect_the_bound_and_the_classes() {
        use retry::sluice::policy::types::{Bucket, TaskView};
        let failure = |class, attempt| Failure {
            task: TaskView {
                seq: 0,
                tenant: 0,
                kind: 0,
                bucket: Bucket::Normal,
                submitted_bucket: Bucket::Normal,
                created_ms: 0,
                bucket_since_ms: 0,
                attempt,
                est_exec_ms: 0,
            },
            class,
            max_attempts: 3,
            random: 0,
        };
        let transient = [failure(ErrorClass::Transient, 1)];
        assert!(decisions(&transient, &[Decision::RetryAfterMs(MAX_RETRY_DELAY_MS)]).is_ok());
        assert!(
            decisions(
                &transient,
                &[Decision::RetryAfterMs(MAX_RETRY_DELAY_MS + 1)]
            )
            .is_err()
        );
        assert!(decisions(&transient, &[]).is_err());
        let permanent = [failure(ErrorClass::Permanent, 1)];
        assert!(decisions(&permanent, &[Decision::RetryAfterMs(1)]).is_err());
        assert!(decisions(&permanent, &[Decision::Dead("bad".into())]).is_ok());
        let spent = [failure(ErrorClass::Transient, 3)];
        assert!(decisions(&spent, &[Decision::RetryAfterMs(1)]).is_err());
    }
}
