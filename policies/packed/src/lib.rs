//! The packed records of the hot policy calls, shared by the host (which packs tasks and
//! unpacks answers) and the guests (which do the reverse), so the layout has one definition.
//!
//! Hot calls pass `list<u64>` rather than lists of records: wasmtime copies an integer list
//! into the guest's memory in one pass, while a record list is lowered field by field, which
//! cost 150–1,000 ns a task here against 5–50 ns for the policy's own work. `wit/policy.wit`
//! documents the same layout.

#![no_std]

extern crate alloc;

use alloc::string::{String, ToString};
use alloc::vec::Vec;

/// A priority bucket, coded as in the WIT `bucket` enum: 0 urgent, 1 normal, 2 low.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bucket {
    Urgent = 0,
    Normal = 1,
    Low = 2,
}

impl Bucket {
    pub const ALL: [Bucket; 3] = [Bucket::Urgent, Bucket::Normal, Bucket::Low];

    pub fn from_code(code: u64) -> Option<Bucket> {
        Bucket::ALL.get(usize::try_from(code).ok()?).copied()
    }

    /// Higher is more urgent: urgent 2, normal 1, low 0.
    pub fn urgency(self) -> u8 {
        2 - self as u8
    }
}

/// What is wrong with a packed list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl core::fmt::Display for Malformed {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.0)
    }
}

/// A task as the hot calls see it. Packed as `VIEW_WORDS` words: `seq`; `tenant << 32 | kind`;
/// `created_ms`; `bucket_since_ms`; `est_exec_ms`; `attempt << 32 | bucket << 8 |
/// submitted_bucket`. Tenant and kind are 32-bit codes of their names (FNV-1a of the UTF-8
/// bytes), so a policy matches a name by its code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// Arrival order: grows with each task.
    pub seq: u64,
    pub tenant: u32,
    pub kind: u32,
    pub bucket: Bucket,
    pub submitted_bucket: Bucket,
    pub created_ms: u64,
    pub bucket_since_ms: u64,
    pub attempt: u32,
    pub est_exec_ms: u64,
}

pub const VIEW_WORDS: usize = 6;

impl View {
    /// The `seq`-th task, submitted to `bucket` and waiting there since time 0, every other
    /// field zero: a base for tests and simulations to set the fields they care about on
    /// (`View { attempt: 2, ..View::in_bucket(1, Bucket::Normal) }`).
    pub fn in_bucket(seq: u64, bucket: Bucket) -> View {
        View {
            seq,
            tenant: 0,
            kind: 0,
            bucket,
            submitted_bucket: bucket,
            created_ms: 0,
            bucket_since_ms: 0,
            attempt: 0,
            est_exec_ms: 0,
        }
    }

    pub fn array(&self) -> [u64; VIEW_WORDS] {
        [
            self.seq,
            u64::from(self.tenant) << 32 | u64::from(self.kind),
            self.created_ms,
            self.bucket_since_ms,
            self.est_exec_ms,
            u64::from(self.attempt) << 32
                | (self.bucket as u64) << 8
                | self.submitted_bucket as u64,
        ]
    }

    pub fn write(&self, out: &mut Vec<u64>) {
        out.extend_from_slice(&self.array());
    }

    /// The packed words, for a `-one` call.
    pub fn words(&self) -> (u64, u64, u64, u64, u64, u64) {
        let [a, b, c, d, e, f] = self.array();
        (a, b, c, d, e, f)
    }

    /// From the words of a `-one` call.
    pub fn from_words(words: (u64, u64, u64, u64, u64, u64)) -> Result<View, Malformed> {
        let (a, b, c, d, e, f) = words;
        View::read(&[a, b, c, d, e, f])
    }

    pub fn read(words: &[u64]) -> Result<View, Malformed> {
        let &[seq, names, created_ms, bucket_since_ms, est_exec_ms, state] = words else {
            return Err(Malformed("a task view is 6 words"));
        };
        let bucket = |code| Bucket::from_code(code).ok_or(Malformed("no such bucket"));
        Ok(View {
            seq,
            tenant: (names >> 32) as u32,
            kind: names as u32,
            bucket: bucket((state >> 8) & 0xff)?,
            submitted_bucket: bucket(state & 0xff)?,
            created_ms,
            bucket_since_ms,
            attempt: (state >> 32) as u32,
            est_exec_ms,
        })
    }
}

/// The 32-bit code of a tenant or kind name: FNV-1a of its UTF-8 bytes.
pub fn name_code(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

/// Reads every `width`-word record of a packed list.
pub fn records<T>(
    words: &[u64],
    width: usize,
    read: impl Fn(&[u64]) -> Result<T, Malformed>,
) -> Result<Vec<T>, Malformed> {
    if !words.len().is_multiple_of(width) {
        return Err(Malformed("the list is not a whole number of records"));
    }
    words.chunks_exact(width).map(read).collect()
}

/// Packs `records` of `width` words each into one list: the mirror of `records`.
pub fn pack<T>(records: &[T], width: usize, write: impl Fn(&T, &mut Vec<u64>)) -> Vec<u64> {
    let mut words = Vec::with_capacity(records.len() * width);
    for record in records {
        write(record, &mut words);
    }
    words
}

/// The admission of one task. Packed as `ADMISSION_WORDS` words: bucket code, rank (lower
/// first inside the bucket), attempt timeout in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    pub bucket: Bucket,
    pub rank: u64,
    pub attempt_timeout_ms: u64,
}

pub const ADMISSION_WORDS: usize = 3;

impl Admission {
    pub fn words(&self) -> (u64, u64, u64) {
        (self.bucket as u64, self.rank, self.attempt_timeout_ms)
    }

    pub fn from_words(words: (u64, u64, u64)) -> Result<Admission, Malformed> {
        Admission::read(&[words.0, words.1, words.2])
    }

    pub fn write(&self, out: &mut Vec<u64>) {
        out.extend_from_slice(&[self.bucket as u64, self.rank, self.attempt_timeout_ms]);
    }

    pub fn read(words: &[u64]) -> Result<Admission, Malformed> {
        let &[bucket, rank, attempt_timeout_ms] = words else {
            return Err(Malformed("an admission is 3 words"));
        };
        Ok(Admission {
            bucket: Bucket::from_code(bucket).ok_or(Malformed("no such bucket"))?,
            rank,
            attempt_timeout_ms,
        })
    }
}

/// Why an attempt failed, coded 0 to 5 in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    Transient = 0,
    NodeBusy = 1,
    LeaseExpired = 2,
    Timeout = 3,
    Permanent = 4,
    InvalidInput = 5,
}

impl ErrorClass {
    pub const ALL: [ErrorClass; 6] = [
        ErrorClass::Transient,
        ErrorClass::NodeBusy,
        ErrorClass::LeaseExpired,
        ErrorClass::Timeout,
        ErrorClass::Permanent,
        ErrorClass::InvalidInput,
    ];

    pub fn from_code(code: u64) -> Option<ErrorClass> {
        ErrorClass::ALL.get(usize::try_from(code).ok()?).copied()
    }

    /// Failures that no retry can cure.
    pub fn is_hopeless(self) -> bool {
        matches!(self, ErrorClass::Permanent | ErrorClass::InvalidInput)
    }
}

/// A failed attempt. Packed as `FAILURE_WORDS` words: the task's view (6), `class << 32 |
/// max_attempts`, and 64 random bits from the host for jitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub task: View,
    pub class: ErrorClass,
    pub max_attempts: u32,
    pub random: u64,
}

pub const FAILURE_WORDS: usize = 8;

/// The words of a packed failure, as a `-one` call takes them.
pub type FailureWords = (u64, u64, u64, u64, u64, u64, u64, u64);

impl Failure {
    pub fn array(&self) -> [u64; FAILURE_WORDS] {
        let [a, b, c, d, e, f] = self.task.array();
        let class = (self.class as u64) << 32 | u64::from(self.max_attempts);
        [a, b, c, d, e, f, class, self.random]
    }

    pub fn words(&self) -> FailureWords {
        let [a, b, c, d, e, f, g, h] = self.array();
        (a, b, c, d, e, f, g, h)
    }

    pub fn from_words(words: FailureWords) -> Result<Failure, Malformed> {
        let (a, b, c, d, e, f, g, h) = words;
        Failure::read(&[a, b, c, d, e, f, g, h])
    }

    pub fn write(&self, out: &mut Vec<u64>) {
        out.extend_from_slice(&self.array());
    }

    pub fn read(words: &[u64]) -> Result<Failure, Malformed> {
        if words.len() != FAILURE_WORDS {
            return Err(Malformed("a failure is 8 words"));
        }
        Ok(Failure {
            task: View::read(&words[..VIEW_WORDS])?,
            class: ErrorClass::from_code(words[6] >> 32).ok_or(Malformed("no such class"))?,
            max_attempts: words[6] as u32,
            random: words[7],
        })
    }
}

/// Why a task is given up on, coded 0 to 3 in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadReason {
    Permanent = 0,
    InvalidInput = 1,
    AttemptsSpent = 2,
    /// The policy's own judgement.
    Policy = 3,
}

impl DeadReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Permanent => "permanent failure",
            DeadReason::InvalidInput => "invalid input",
            DeadReason::AttemptsSpent => "attempts spent",
            DeadReason::Policy => "given up by the retry policy",
        }
    }
}

/// A retry decision, one word: the delay in ms, or `DEAD | reason code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    RetryAfterMs(u64),
    Dead(DeadReason),
}

pub const DEAD: u64 = 1 << 63;

impl Decision {
    pub fn word(self) -> u64 {
        match self {
            Decision::RetryAfterMs(delay_ms) => delay_ms.min(DEAD - 1),
            Decision::Dead(reason) => DEAD | reason as u64,
        }
    }

    pub fn read(word: u64) -> Result<Decision, Malformed> {
        if word & DEAD == 0 {
            return Ok(Decision::RetryAfterMs(word));
        }
        const REASONS: [DeadReason; 4] = [
            DeadReason::Permanent,
            DeadReason::InvalidInput,
            DeadReason::AttemptsSpent,
            DeadReason::Policy,
        ];
        usize::try_from(word & !DEAD)
            .ok()
            .and_then(|code| REASONS.get(code).copied())
            .map(Decision::Dead)
            .ok_or(Malformed("no such dead reason"))
    }
}

/// A search hit. In a merge's input, packed as 2 words: `id`, then `child << 32 | distance`
/// (the f32's bits); each child's hits are contiguous and nearest first. In its answer, 2
/// words: `id`, then the distance's bits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub id: u64,
    pub distance: f32,
}

pub const HIT_WORDS: usize = 2;

impl Hit {
    pub fn write_part(&self, child: u32, out: &mut Vec<u64>) {
        out.push(self.id);
        out.push(u64::from(child) << 32 | u64::from(self.distance.to_bits()));
    }

    pub fn read_part(words: &[u64]) -> Result<(u32, Hit), Malformed> {
        let &[id, rest] = words else {
            return Err(Malformed("a hit is 2 words"));
        };
        let hit = Hit {
            id,
            distance: f32::from_bits(rest as u32),
        };
        Ok(((rest >> 32) as u32, hit))
    }

    pub fn write(&self, out: &mut Vec<u64>) {
        out.push(self.id);
        out.push(u64::from(self.distance.to_bits()));
    }

    pub fn read(words: &[u64]) -> Result<Hit, Malformed> {
        let &[id, distance] = words else {
            return Err(Malformed("a hit is 2 words"));
        };
        let bits = u32::try_from(distance).map_err(|_| Malformed("a distance is 32 bits"))?;
        Ok(Hit {
            id,
            distance: f32::from_bits(bits),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_as_written() {
        let view = View {
            seq: 9,
            tenant: u32::MAX,
            kind: 7,
            bucket: Bucket::Urgent,
            submitted_bucket: Bucket::Low,
            created_ms: 1,
            bucket_since_ms: 2,
            attempt: 3,
            est_exec_ms: 4,
        };
        let failure = Failure {
            task: view,
            class: ErrorClass::InvalidInput,
            max_attempts: 100,
            random: u64::MAX,
        };
        let mut words = Vec::new();
        failure.write(&mut words);
        assert_eq!(words.len(), FAILURE_WORDS);
        assert_eq!(Failure::read(&words), Ok(failure));
        assert_eq!(Failure::from_words(failure.words()), Ok(failure));
        assert_eq!(View::from_words(view.words()), Ok(view));
        assert_eq!(View::read(&words[..VIEW_WORDS]), Ok(view));
        for decision in [
            Decision::RetryAfterMs(0),
            Decision::RetryAfterMs(86_400_000),
            Decision::Dead(DeadReason::AttemptsSpent),
        ] {
            assert_eq!(Decision::read(decision.word()), Ok(decision));
        }
        assert!(Decision::read(DEAD | 9).is_err());
        let mut hits = Vec::new();
        Hit {
            id: 5,
            distance: 0.25,
        }
        .write_part(3, &mut hits);
        assert_eq!(
            Hit::read_part(&hits),
            Ok((
                3,
                Hit {
                    id: 5,
                    distance: 0.25
                }
            ))
        );
        assert!(records(&[1, 2, 3], 2, Hit::read).is_err());
        assert_eq!(
            records(&[5, u64::from(0.5f32.to_bits())], 2, Hit::read)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn name_codes_are_fnv1a() {
        assert_eq!(name_code(""), 0x811c_9dc5);
        assert_eq!(name_code("a"), 0xe40c_292c);
    }
}

/// One child's answer: its hits, nearest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    pub child: u32,
    pub weight: f32,
    pub hits: Vec<Hit>,
}

/// Unpacks the children's hits: each run of one child's hits is that child's part.
pub fn parts(weights: &[f32], words: &[u64]) -> Result<Vec<Part>, String> {
    let mut parts: Vec<Part> = Vec::new();
    if !words.len().is_multiple_of(HIT_WORDS) {
        return Err("the hits are not a whole number of 2-word records".into());
    }
    for pair in words.chunks_exact(HIT_WORDS) {
        let (child, hit) = Hit::read_part(pair).map_err(|e| e.0.to_string())?;
        match parts.last_mut() {
            Some(part) if part.child == child => part.hits.push(hit),
            _ => parts.push(Part {
                child,
                weight: weights.get(child as usize).copied().unwrap_or(1.0),
                hits: alloc::vec![hit],
            }),
        }
    }
    Ok(parts)
}

/// Packs merged hits as a merge policy answers them.
pub fn pack_hits(hits: &[Hit]) -> Vec<u64> {
    let mut answer = Vec::with_capacity(hits.len() * HIT_WORDS);
    for hit in hits {
        hit.write(&mut answer);
    }
    answer
}
