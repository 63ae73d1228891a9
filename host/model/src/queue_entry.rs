//! A queued task as the dispatcher needs it: where it waits, in which order, what it needs of a
//! worker, what the aging policy reads of it (its view and its names), and its deadline. The store keeps this summary as
//! the value of the task's state-index entry, so queues are rebuilt at start without decoding
//! every task record.

use super::{PolicyKind, Priority, Task, TaskId, TaskNames, VariantTag};
use policy_packed::{Bucket, View, name_code};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueEntry {
    pub id: TaskId,
    pub bucket: Priority,
    pub rank: u64,
    pub gpu_memory_mb: u64,
    pub view: View,
    pub deadline_at_ms: Option<u64>,
    /// Its variant of a live aging experiment: the aging step asks that variant about it.
    pub aging_variant: Option<VariantTag>,
    /// Its kind, tenant, device and labels, for policies that read names (and the labels for
    /// placement). Shared with the other entries of the same names once the queues intern it.
    pub names: Arc<TaskNames>,
    /// What few tasks ask of a worker beside memory and labels. Boxed, and `None` when it would be empty:
    /// the server holds an entry for every queued task, and inline these empty maps and strings
    /// were 72 of each entry's 192 bytes.
    pub needs: Option<Box<QueueNeeds>>,
}

/// A queued task's concurrency key and model.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QueueNeeds {
    /// Claims skip it while its key runs as many tasks as its limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// The model it runs, for warm placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// What it must share with the others of a GPU batch beside its kind and model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_key: Option<String>,
}

impl QueueNeeds {
    fn is_empty(&self) -> bool {
        self.concurrency_key.is_none() && self.model.is_none() && self.batch_key.is_none()
    }

    /// `Some` when there is anything to hold.
    pub fn boxed(self) -> Option<Box<QueueNeeds>> {
        (!self.is_empty()).then(|| Box::new(self))
    }
}

pub fn to_bucket(priority: Priority) -> Bucket {
    match priority {
        Priority::Urgent => Bucket::Urgent,
        Priority::Normal => Bucket::Normal,
        Priority::Low => Bucket::Low,
    }
}

pub fn from_bucket(bucket: Bucket) -> Priority {
    match bucket {
        Bucket::Urgent => Priority::Urgent,
        Bucket::Normal => Priority::Normal,
        Bucket::Low => Priority::Low,
    }
}

/// The packed view of `task` that the aging and retry policies read.
pub fn view(task: &Task) -> View {
    View {
        // The creation event's seq: arrival order across the whole system.
        seq: task.event_seqs.first().copied().unwrap_or(task.rank),
        tenant: name_code(&task.tenant),
        kind: name_code(&task.kind),
        bucket: to_bucket(task.bucket),
        submitted_bucket: to_bucket(task.priority),
        created_ms: task.created_at_ms,
        bucket_since_ms: task.bucket_since_ms,
        attempt: task.attempt,
        est_exec_ms: task.est_exec_ms,
    }
}

/// Layout version of `encode`: 2 added the aging variant; 3 made the JSON after the fixed part
/// an object of the labels, the concurrency key and the model (2 had the labels alone); 4 put
/// the kind, tenant and device in it too, so the aging policy reads names without the record.
const FORMAT: u8 = 4;

/// The JSON after the fixed part.
#[derive(serde::Serialize, serde::Deserialize)]
struct EntryJson<'a> {
    #[serde(flatten)]
    names: std::borrow::Cow<'a, TaskNames>,
    #[serde(flatten)]
    needs: std::borrow::Cow<'a, QueueNeeds>,
}
const FIXED_BYTES: usize = 2 + 8 * 2 + 8 * 6 + 1 + 8 + 1 + 4 + 1;

impl QueueEntry {
    pub fn of(task: &Task) -> QueueEntry {
        QueueEntry {
            id: task.id,
            bucket: task.bucket,
            rank: task.rank,
            gpu_memory_mb: task.resources.gpu_memory_mb,
            view: view(task),
            deadline_at_ms: task.deadline_at_ms,
            aging_variant: task.variant(PolicyKind::Aging),
            names: Arc::new(TaskNames::of(task)),
            needs: QueueNeeds {
                concurrency_key: task.concurrency_key.clone(),
                model: task.resources.model.clone(),
                batch_key: task.resources.batch_key.clone(),
            }
            .boxed(),
        }
    }

    /// Labels the worker must carry, each with the same value.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.names.labels
    }

    pub fn concurrency_key(&self) -> Option<&str> {
        self.needs.as_ref()?.concurrency_key.as_deref()
    }

    pub fn model(&self) -> Option<&str> {
        self.needs.as_ref()?.model.as_deref()
    }

    pub fn batch_key(&self) -> Option<&str> {
        self.needs.as_ref()?.batch_key.as_deref()
    }

    /// Whether `other` may run in one GPU batch with this task: the same kind, model and
    /// batch key.
    pub fn batches_with(&self, other: &QueueEntry) -> bool {
        self.view.kind == other.view.kind
            && self.names.kind == other.names.kind
            && self.model() == other.model()
            && self.batch_key() == other.batch_key()
    }

    /// `[bucket][format][rank][gpu_memory_mb][view: 6 words][has deadline][deadline]
    /// [has aging variant][experiment: 4 bytes][variant]` then its names, labels, concurrency
    /// key and model as a JSON object. The first byte is the bucket, as in the index entries
    /// of other states.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED_BYTES + 2);
        out.push(self.bucket.index() as u8);
        out.push(FORMAT);
        out.extend_from_slice(&self.rank.to_be_bytes());
        out.extend_from_slice(&self.gpu_memory_mb.to_be_bytes());
        for word in self.view.array() {
            out.extend_from_slice(&word.to_be_bytes());
        }
        out.push(u8::from(self.deadline_at_ms.is_some()));
        out.extend_from_slice(&self.deadline_at_ms.unwrap_or(0).to_be_bytes());
        out.push(u8::from(self.aging_variant.is_some()));
        let (experiment, variant) = self
            .aging_variant
            .map_or((0, 0), |tag| (tag.experiment, tag.variant));
        out.extend_from_slice(&experiment.to_be_bytes());
        out.push(variant);
        let json = EntryJson {
            names: std::borrow::Cow::Borrowed(&self.names),
            needs: std::borrow::Cow::Owned(self.needs.as_deref().cloned().unwrap_or_default()),
        };
        // Plain strings always serialize.
        out.extend_from_slice(&serde_json::to_vec(&json).unwrap_or_default());
        out
    }

    /// None for bytes of another layout (an older index entry): read the task record instead.
    pub fn decode(id: TaskId, bytes: &[u8]) -> Option<QueueEntry> {
        if bytes.len() < FIXED_BYTES || bytes[1] != FORMAT {
            return None;
        }
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        let bucket = Priority::from_index(usize::from(bytes[0]))?;
        let mut view_words = [0u64; 6];
        for (i, slot) in view_words.iter_mut().enumerate() {
            *slot = word(18 + 8 * i)?;
        }
        let view = View::read(&view_words).ok()?;
        let deadline_at_ms = (bytes[66] == 1).then(|| word(67)).flatten();
        let aging_variant = (bytes[75] == 1).then(|| VariantTag {
            kind: PolicyKind::Aging,
            experiment: u32::from_be_bytes([bytes[76], bytes[77], bytes[78], bytes[79]]),
            variant: bytes[80],
        });
        let json: EntryJson = serde_json::from_slice(&bytes[FIXED_BYTES..]).ok()?;
        Some(QueueEntry {
            id,
            bucket,
            rank: word(2)?,
            gpu_memory_mb: word(10)?,
            view,
            deadline_at_ms,
            aging_variant,
            names: Arc::new(json.names.into_owned()),
            needs: json.needs.into_owned().boxed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_survives_its_encoding_and_old_entries_are_not_misread() {
        let mut entry = QueueEntry {
            id: TaskId::from_u128(7),
            bucket: Priority::Low,
            rank: 42,
            gpu_memory_mb: 8_000,
            view: View {
                seq: 9,
                tenant: 1,
                kind: 2,
                bucket: Bucket::Low,
                submitted_bucket: Bucket::Low,
                created_ms: 100,
                bucket_since_ms: 200,
                attempt: 1,
                est_exec_ms: 300,
            },
            deadline_at_ms: None,
            aging_variant: None,
            names: Arc::new(TaskNames {
                kind: "oct.scan".into(),
                tenant: "site-a".into(),
                device: "scanner-7".into(),
                labels: BTreeMap::new(),
            }),
            needs: None,
        };
        assert_eq!(
            QueueEntry::decode(entry.id, &entry.encode()),
            Some(entry.clone())
        );
        Arc::make_mut(&mut entry.names)
            .labels
            .insert("site".into(), "a".into());
        entry.deadline_at_ms = Some(5_000);
        assert_eq!(
            QueueEntry::decode(entry.id, &entry.encode()),
            Some(entry.clone())
        );
        entry.aging_variant = Some(VariantTag {
            kind: PolicyKind::Aging,
            experiment: 70_000,
            variant: 3,
        });
        assert_eq!(
            QueueEntry::decode(entry.id, &entry.encode()),
            Some(entry.clone())
        );
        entry.needs = QueueNeeds {
            concurrency_key: Some("scanner-7".into()),
            model: Some("seg-v3".into()),
            batch_key: Some("512x496".into()),
        }
        .boxed();
        assert_eq!(entry.batch_key(), Some("512x496"));
        assert_eq!(entry.concurrency_key(), Some("scanner-7"));
        assert_eq!(entry.model(), Some("seg-v3"));
        assert_eq!(entry.labels()["site"], "a");
        assert_eq!(
            QueueEntry::decode(entry.id, &entry.encode()),
            Some(entry.clone())
        );
        assert_eq!(entry.names.device, "scanner-7");
        // Entries of formats 1 to 3 are left to the task record.
        for format in [1, 2, 3] {
            let mut old = entry.encode();
            old[1] = format;
            assert_eq!(QueueEntry::decode(entry.id, &old), None);
        }
        assert_eq!(QueueEntry::decode(entry.id, &[2]), None);
        assert_eq!(QueueEntry::decode(entry.id, &entry.encode()[..40]), None);
    }

    /// The server holds one of these per queued task: a million of them is the larger part of
    /// its memory at a restart (docs/benchmarks.md, "The stored format").
    #[test]
    fn an_entry_without_needs_stays_small() {
        assert!(std::mem::size_of::<QueueEntry>() <= 128);
    }
}
