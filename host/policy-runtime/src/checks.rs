//! What the host can use from a policy's answer. The same checks judge the conformance cases
//! at upload and every live decision, so a module that answers nonsense later (an index out
//! of range, a delay past the bound) is treated as faulting, exactly like one that traps.

use super::bindings::{aging, split_layout};
use aging::exports::sluice::policy::aging::Promotion;
use policy_packed::{ADMISSION_WORDS, Admission, Bucket, Decision, Failure, HIT_WORDS, Hit, View};
use split_layout::{ShardFilter, Subtask};

/// The longest retry delay a policy may ask for.
pub const MAX_RETRY_DELAY_MS: u64 = 24 * 3_600_000;
/// The longest attempt timeout an admission may set.
pub const MAX_ATTEMPT_TIMEOUT_MS: u64 = 365 * 24 * 3_600_000;
/// The most children one split may make.
pub const MAX_CHILDREN: usize = 1024;
/// The most centroids one child's filter may list.
pub const MAX_CENTROIDS: usize = 65_536;
/// The longest reason (for a refused split or merge) kept from a policy.
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

pub fn bucket_weights(weights: Vec<u32>) -> Result<Vec<u32>, String> {
    if weights.len() != 3 {
        return Err(format!(
            "bucket-weights gave {} weights, not 3",
            weights.len()
        ));
    }
    if weights.iter().all(|&w| w == 0) || weights.iter().any(|&w| w > 1_000_000) {
        return Err("bucket-weights must each be 0 to 1000000 and not all 0".into());
    }
    Ok(weights)
}

/// Tenants a priority policy may weigh, and the largest weight (as the SDK's components check).
pub const MAX_TENANT_WEIGHTS: usize = 10_000;
pub const MAX_TENANT_WEIGHT: u32 = 10_000;

/// Each tenant named once, by a valid name, with a weight of 1 to `MAX_TENANT_WEIGHT`.
pub fn tenant_weights(
    weights: Option<Vec<(String, u32)>>,
) -> Result<Option<Vec<(String, u32)>>, String> {
    let Some(weights) = weights else {
        return Ok(None);
    };
    if weights.len() > MAX_TENANT_WEIGHTS {
        return Err(format!(
            "tenant-weights named {} tenants, more than {MAX_TENANT_WEIGHTS}",
            weights.len()
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (tenant, weight) in &weights {
        sluice_model::check_name("tenant", tenant).map_err(|e| format!("tenant-weights: {e}"))?;
        if !(1..=MAX_TENANT_WEIGHT).contains(weight) {
            return Err(format!(
                "tenant-weights gave {tenant} {weight}, outside 1..={MAX_TENANT_WEIGHT}"
            ));
        }
        if !seen.insert(tenant.as_str()) {
            return Err(format!("tenant-weights named {tenant} twice"));
        }
    }
    Ok(Some(weights))
}

/// Unpacks one admission per task asked about, each with a timeout in bounds.
pub fn admissions(asked: usize, words: &[u64]) -> Result<Vec<Admission>, String> {
    same_length(words.len(), asked * ADMISSION_WORDS, "admission words")?;
    let admitted = policy_packed::records(words, ADMISSION_WORDS, Admission::read)
        .map_err(|e| e.to_string())?;
    match admitted
        .iter()
        .position(|a| !(1..=MAX_ATTEMPT_TIMEOUT_MS).contains(&a.attempt_timeout_ms))
    {
        Some(i) => Err(format!(
            "admission {i} has attempt-timeout-ms {}, outside 1..={MAX_ATTEMPT_TIMEOUT_MS}",
            admitted[i].attempt_timeout_ms
        )),
        None => Ok(admitted),
    }
}

fn from_wit(bucket: aging::sluice::policy::types::Bucket) -> Bucket {
    use aging::sluice::policy::types::Bucket as Wit;
    match bucket {
        Wit::Urgent => Bucket::Urgent,
        Wit::Normal => Bucket::Normal,
        Wit::Low => Bucket::Low,
    }
}

/// The moves a policy answered: each index in range, once, to a more urgent bucket.
pub fn promotions(
    waiting: &[View],
    answer: impl IntoIterator<Item = Promotion>,
) -> Result<Vec<(u32, Bucket)>, String> {
    let answer = answer.into_iter();
    let mut seen = Seen::new(waiting.len());
    let mut moves = Vec::with_capacity(answer.size_hint().0);
    for promotion in answer {
        let index = promotion.index as usize;
        let Some(task) = waiting.get(index) else {
            return Err(format!(
                "promotion index {} is out of range ({} waiting)",
                promotion.index,
                waiting.len()
            ));
        };
        if seen.insert(index) {
            return Err(format!("index {} is promoted twice", promotion.index));
        }
        let to = from_wit(promotion.to);
        if to.urgency() <= task.bucket.urgency() {
            return Err(format!(
                "index {} is moved to {to:?}, which is not above its bucket {:?}",
                promotion.index, task.bucket
            ));
        }
        moves.push((promotion.index, to));
    }
    Ok(moves)
}

/// Which indexes below a bound were seen: a word of bits for small batches (a single decision
/// allocates nothing), a flag per index past that.
enum Seen {
    Bits(u64),
    Flags(Vec<bool>),
}

impl Seen {
    fn new(bound: usize) -> Seen {
        if bound <= 64 {
            Seen::Bits(0)
        } else {
            Seen::Flags(vec![false; bound])
        }
    }

    /// Marks `index` (below the bound); true if it was already marked.
    fn insert(&mut self, index: usize) -> bool {
        match self {
            Seen::Bits(bits) => {
                let bit = 1u64 << index;
                let was = *bits & bit != 0;
                *bits |= bit;
                was
            }
            Seen::Flags(flags) => std::mem::replace(&mut flags[index], true),
        }
    }
}

/// Unpacks one decision per failure: a delay within the bound, and dead where no retry can
/// help (a permanent or invalid-input failure, or the attempts spent).
pub fn decisions(failures: &[Failure], words: &[u64]) -> Result<Vec<Decision>, String> {
    same_length(words.len(), failures.len(), "decisions")?;
    let mut decided = Vec::with_capacity(words.len());
    for (i, (failure, &word)) in failures.iter().zip(words).enumerate() {
        let decision = Decision::read(word).map_err(|e| format!("decision {i}: {e}"))?;
        if let Decision::RetryAfterMs(delay) = decision {
            if delay > MAX_RETRY_DELAY_MS {
                return Err(format!(
                    "decision {i} retries after {delay} ms, past the {MAX_RETRY_DELAY_MS} ms bound"
                ));
            }
            if failure.class.is_hopeless() {
                return Err(format!(
                    "decision {i} retries a {:?} failure, which must be dead",
                    failure.class
                ));
            }
            if failure.task.attempt >= failure.max_attempts {
                return Err(format!(
                    "decision {i} retries attempt {} of at most {}",
                    failure.task.attempt, failure.max_attempts
                ));
            }
        }
        decided.push(decision);
    }
    Ok(decided)
}

pub fn subtasks(
    answer: Result<Vec<Subtask>, String>,
) -> Result<Result<Vec<Subtask>, String>, String> {
    let children = match answer {
        Ok(children) => children,
        Err(refusal) => {
            reason(&refusal, "a split refusal's")?;
            return Ok(Err(refusal));
        }
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
    Ok(Ok(children))
}

/// Unpacks a merge: at most `k` hits, sorted by (distance, id), each id once, each drawn from
/// the children's hits (`parts`, packed).
pub fn merged(
    k: u32,
    parts: &[u64],
    answer: Result<Vec<u64>, String>,
) -> Result<Result<Vec<Hit>, String>, String> {
    let words = match answer {
        Ok(words) => words,
        Err(refusal) => {
            reason(&refusal, "a merge refusal's")?;
            return Ok(Err(refusal));
        }
    };
    let hits = policy_packed::records(&words, HIT_WORDS, Hit::read).map_err(|e| e.to_string())?;
    if hits.len() > k as usize {
        return Err(format!("merged {} hits for k = {k}", hits.len()));
    }
    let mut given: Vec<u64> = parts.iter().step_by(HIT_WORDS).copied().collect();
    given.sort_unstable();
    let mut ids: Vec<u64> = Vec::with_capacity(hits.len());
    for (i, hit) in hits.iter().enumerate() {
        if hit.distance.is_nan() {
            return Err(format!("hit {i} has a NaN distance"));
        }
        if given.binary_search(&hit.id).is_err() {
            return Err(format!("hit {i} (id {}) is in no part", hit.id));
        }
        if let Some(before) = i.checked_sub(1).map(|j| &hits[j])
            && before
                .distance
                .total_cmp(&hit.distance)
                .then(before.id.cmp(&hit.id))
                != std::cmp::Ordering::Less
        {
            return Err(format!("hit {i} is out of order (by distance, then id)"));
        }
        ids.push(hit.id);
    }
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err("an id is merged twice".into());
    }
    Ok(Ok(hits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy_packed::{DeadReason, ErrorClass};

    fn packed_hits(child: u32, hits: &[(u64, f32)]) -> Vec<u64> {
        let mut words = Vec::new();
        for &(id, distance) in hits {
            Hit { id, distance }.write_part(child, &mut words);
        }
        words
    }

    fn answer(hits: &[(u64, f32)]) -> Result<Vec<u64>, String> {
        let mut words = Vec::new();
        for &(id, distance) in hits {
            Hit { id, distance }.write(&mut words);
        }
        Ok(words)
    }

    #[test]
    fn a_merge_answer_must_be_sorted_unique_bounded_and_from_the_parts() {
        let parts = packed_hits(0, &[(1, 0.1), (2, 0.2), (3, 0.2)]);
        let good = [(1, 0.1), (2, 0.2), (3, 0.2)];
        assert_eq!(merged(3, &parts, answer(&good)).unwrap().unwrap().len(), 3);
        assert!(merged(2, &parts, answer(&good)).is_err());
        assert!(merged(3, &parts, answer(&[(2, 0.2), (1, 0.1)])).is_err());
        assert!(merged(3, &parts, answer(&[(3, 0.2), (2, 0.2)])).is_err());
        assert!(merged(3, &parts, answer(&[(1, 0.1), (1, 0.1)])).is_err());
        assert!(merged(3, &parts, answer(&[(9, 0.0)])).is_err());
        assert!(merged(3, &parts, Ok(vec![1])).is_err());
        assert!(merged(3, &parts, Err("no parts".into())).unwrap().is_err());
    }

    fn view(bucket: Bucket, attempt: u32) -> View {
        View {
            attempt,
            ..View::in_bucket(0, bucket)
        }
    }

    #[test]
    fn a_retry_answer_must_respect_the_bound_and_the_classes() {
        let failure = |class, attempt| Failure {
            task: view(Bucket::Normal, attempt),
            class,
            max_attempts: 3,
            random: 0,
        };
        let retry = |ms| Decision::RetryAfterMs(ms).word();
        let dead = Decision::Dead(DeadReason::Permanent).word();
        let transient = [failure(ErrorClass::Transient, 1)];
        assert!(decisions(&transient, &[retry(MAX_RETRY_DELAY_MS)]).is_ok());
        assert!(decisions(&transient, &[retry(MAX_RETRY_DELAY_MS + 1)]).is_err());
        assert!(decisions(&transient, &[]).is_err());
        assert!(decisions(&transient, &[policy_packed::DEAD | 77]).is_err());
        let permanent = [failure(ErrorClass::Permanent, 1)];
        assert!(decisions(&permanent, &[retry(1)]).is_err());
        assert!(decisions(&permanent, &[dead]).is_ok());
        let spent = [failure(ErrorClass::Transient, 3)];
        assert!(decisions(&spent, &[retry(1)]).is_err());
    }

    #[test]
    fn promotions_must_be_in_range_once_each_and_upward() {
        use aging::sluice::policy::types::Bucket as Wit;
        let waiting = [view(Bucket::Low, 0), view(Bucket::Normal, 0)];
        let to = |index, to| Promotion { index, to };
        assert_eq!(
            promotions(&waiting, vec![to(1, Wit::Urgent), to(0, Wit::Normal)]).unwrap(),
            [(1, Bucket::Urgent), (0, Bucket::Normal)]
        );
        assert_eq!(promotions(&waiting, vec![]).unwrap(), []);
        assert!(promotions(&waiting, vec![to(2, Wit::Urgent)]).is_err());
        assert!(promotions(&waiting, vec![to(u32::MAX, Wit::Urgent)]).is_err());
        assert!(promotions(&waiting, vec![to(0, Wit::Normal), to(0, Wit::Urgent)]).is_err());
        assert!(
            promotions(&waiting, vec![to(1, Wit::Normal)]).is_err(),
            "not upward"
        );
        assert!(
            promotions(&waiting, vec![to(1, Wit::Low)]).is_err(),
            "downward"
        );
        assert!(promotions(&[], vec![to(0, Wit::Urgent)]).is_err());
        // Past 64 waiting tasks the indexes are tracked another way; the same rules hold.
        let many = vec![view(Bucket::Low, 0); 100];
        assert_eq!(
            promotions(&many, vec![to(99, Wit::Normal)]).unwrap().len(),
            1
        );
        assert!(promotions(&many, vec![to(80, Wit::Normal), to(80, Wit::Urgent)]).is_err());
        assert!(promotions(&many, vec![to(100, Wit::Normal)]).is_err());
    }

    #[test]
    fn admissions_must_be_whole_one_per_task_and_bounded() {
        let mut words = Vec::new();
        let admission = Admission {
            bucket: Bucket::Low,
            rank: 4,
            attempt_timeout_ms: 10,
        };
        admission.write(&mut words);
        assert_eq!(admissions(1, &words).unwrap(), [admission]);
        assert!(admissions(2, &words).is_err());
        assert!(admissions(1, &[9, 4, 10]).is_err(), "no bucket 9");
        assert!(admissions(1, &[2, 4, 0]).is_err(), "a zero timeout");
    }
}
