//! Names for the components that read them: a batch's distinct names once each, and which one
//! each task has (`named-*` exports in `wit/policy.wit`). Built only for a component with a
//! named export, so a policy that reads no names pays nothing for them.

use super::bindings::names::TaskNames;
use sluice_model::NamesRef;
use std::collections::HashMap;

/// One task's names as the WIT record.
pub fn record(names: NamesRef<'_>) -> TaskNames {
    TaskNames {
        kind: names.kind.to_owned(),
        tenant: names.tenant.to_owned(),
        device: names.device.to_owned(),
        labels: names
            .labels
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
    }
}

/// A batch's names: each distinct one once, and for each task the index of its own.
pub fn table(names: &[NamesRef<'_>]) -> (Vec<TaskNames>, Vec<u32>) {
    let mut distinct: HashMap<NamesRef<'_>, u32> = HashMap::new();
    let mut records = Vec::new();
    let mut which = Vec::with_capacity(names.len());
    for &task in names {
        let index = *distinct.entry(task).or_insert_with(|| {
            records.push(record(task));
            // A batch is bounded far below four billion tasks.
            (records.len() - 1) as u32
        });
        which.push(index);
    }
    debug_assert_eq!(which.len(), names.len());
    (records, which)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_batch_sends_each_distinct_names_once() {
        let labels = BTreeMap::from([("ed".to_owned(), "true".to_owned())]);
        let none = BTreeMap::new();
        let a = NamesRef {
            kind: "oct.qa",
            tenant: "site-a",
            device: "scanner-1",
            labels: &labels,
        };
        let b = NamesRef { labels: &none, ..a };
        let (records, which) = table(&[a, b, a, a, b]);
        assert_eq!(which, vec![0, 1, 0, 0, 1]);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].labels, vec![("ed".into(), "true".into())]);
        assert!(records[1].labels.is_empty());
        assert_eq!(records[1].device, "scanner-1");
    }
}
