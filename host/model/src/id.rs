//! Task identifiers: 128-bit, time-sortable (ULID layout), shown as 26 Crockford base32 characters.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A task's identity. The top 48 bits are the creation time in ms, so ids sort by arrival.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(u128);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{0}` is not a task id (26 characters of Crockford base32)")]
pub struct IdError(pub String);

impl TaskId {
    pub const MIN: TaskId = TaskId(0);

    pub fn from_u128(raw: u128) -> Self {
        TaskId(raw)
    }

    pub fn as_u128(self) -> u128 {
        self.0
    }

    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        TaskId(u128::from_be_bytes(bytes))
    }

    /// The creation time encoded in the id.
    pub fn created_ms(self) -> u64 {
        (self.0 >> 80) as u64
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&ulid::Ulid(self.0), f)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TaskId({self})")
    }
}

impl FromStr for TaskId {
    type Err = IdError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // 26 base32 digits carry 130 bits; a first digit past 7 would not fit in 128.
        if text.len() != ulid::ULID_LEN || !matches!(text.as_bytes()[0], b'0'..=b'7') {
            return Err(IdError(truncate(text)));
        }
        ulid::Ulid::from_string(text)
            .map(|u| TaskId(u.0))
            .map_err(|_| IdError(truncate(text)))
    }
}

fn truncate(text: &str) -> String {
    text.chars().take(64).collect()
}

/// A task id in the API document: 26 characters of Crockford base32 (a ULID).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for TaskId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some("^[0-7][0-9A-HJKMNP-TV-Z]{25}$"))
            .description(Some("A task id: a ULID, 26 characters of Crockford base32"))
            .examples(["01ARZ3NDEKTSV4RRFFQ69G5FAV"])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for TaskId {}

impl Serialize for TaskId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The hasher of the maps keyed by task id (`TaskIdMap`). Ids are made by the
/// server, never chosen by a client (one can only look an id up), and their low 80 bits are
/// random or count up within a millisecond, so one multiply spreads them over a table's buckets:
/// SipHash's keyed defence against chosen keys buys nothing here, and it was a tenth of the
/// writer's time.
#[derive(Clone, Copy, Default)]
pub struct TaskIdHasher(u64);

/// Odd, about 2^64 / φ: a multiply by it maps consecutive inputs far apart.
const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

impl std::hash::Hasher for TaskIdHasher {
    fn write_u128(&mut self, value: u128) {
        let folded = (value as u64) ^ ((value >> 64) as u64);
        self.0 = (self.0 ^ folded).wrapping_mul(SPREAD);
    }

    /// Any other key (not what the maps hold, but still hashed correctly).
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(SPREAD);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub type TaskIdMap<V> =
    std::collections::HashMap<TaskId, V, std::hash::BuildHasherDefault<TaskIdHasher>>;

/// Issues strictly increasing ids from the caller's clock and random bits, so a replay with the
/// same inputs yields the same ids, and a clock that steps back never yields a smaller id.
#[derive(Debug, Default, Clone)]
pub struct IdGenerator {
    last: u128,
}

const RANDOM_BITS: u32 = 80;

impl IdGenerator {
    /// Resumes after the largest id already issued (found in the store at start).
    pub fn resume_after(last: TaskId) -> Self {
        IdGenerator { last: last.0 }
    }

    /// The largest id issued so far.
    pub fn last(&self) -> TaskId {
        TaskId(self.last)
    }

    pub fn next(&mut self, now_ms: u64, random: u128) -> TaskId {
        let time_part = u128::from(now_ms & ((1 << 48) - 1)) << RANDOM_BITS;
        // Half the random space leaves room to count up within one millisecond without overflow.
        let candidate = time_part | (random & ((1u128 << (RANDOM_BITS - 1)) - 1));
        self.last = if candidate > self.last {
            candidate
        } else {
            self.last + 1
        };
        TaskId(self.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hashbrown picks a bucket by a hash's low bits and tags entries with its top 7: ids
    /// counted up within a millisecond fill every bucket once, and random ones spread.
    #[test]
    fn task_id_hashes_spread_over_buckets_and_tags() {
        use std::hash::BuildHasher;
        let hasher = std::hash::BuildHasherDefault::<TaskIdHasher>::default();
        let mut ids = IdGenerator::default();
        let first = ids.next(1_700_000_000_000, 0x1234_5678_9abc_def0_1234);
        let counted: Vec<TaskId> = std::iter::once(first)
            .chain((1..4_096).map(|_| ids.next(1_699_999_999_999, 0)))
            .collect();
        assert_eq!(counted[4_095].0, first.0 + 4_095, "counted up");
        let mut chance = 0x2545_f491_4f6c_dd1d_u128;
        let random: Vec<TaskId> = (0..4_096)
            .map(|n| {
                chance = chance.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(1);
                IdGenerator::default().next(1_700_000_000_000 + n, chance >> 40)
            })
            .collect();
        for (what, ids) in [("counted", &counted), ("random", &random)] {
            let hashes: Vec<u64> = ids.iter().map(|id| hasher.hash_one(id)).collect();
            let buckets: std::collections::HashSet<u64> =
                hashes.iter().map(|h| h & 4_095).collect();
            let tags: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
            let least = if what == "counted" { 4_096 } else { 2_400 };
            assert!(buckets.len() >= least, "{what}: {} buckets", buckets.len());
            assert!(tags.len() >= 120, "{what}: {} tags", tags.len());
        }
        let mut map: TaskIdMap<usize> = TaskIdMap::default();
        map.extend(
            counted
                .iter()
                .chain(&random)
                .enumerate()
                .map(|(n, id)| (*id, n)),
        );
        assert_eq!(map.len(), 8_192);
        assert_eq!(map.get(&random[7]), Some(&4_103));
    }

    #[test]
    fn ids_sort_by_time_and_stay_monotonic_within_a_millisecond() {
        let mut ids = IdGenerator::default();
        let a = ids.next(1_000, u128::MAX);
        let b = ids.next(1_000, 0);
        let c = ids.next(999, 5);
        let d = ids.next(1_001, 0);
        assert!(a < b && b < c && c < d);
        assert_eq!(d.created_ms(), 1_001);
    }

    #[test]
    fn text_form_round_trips_and_rejects_garbage() {
        let id = IdGenerator::default().next(1_700_000_000_000, 42);
        let text = id.to_string();
        assert_eq!(text.len(), 26);
        assert_eq!(text.parse::<TaskId>(), Ok(id));
        assert!("not-an-id".parse::<TaskId>().is_err());
        assert!("".parse::<TaskId>().is_err());
        assert!("ZZZZZZZZZZZZZZZZZZZZZZZZZZ".parse::<TaskId>().is_err());
    }
}
