//! The k-way merge the merge policies share: the children's packed hits unpacked into one part
//! per child, and merged into the `k` nearest, each id once (a vector held by two shards counts
//! once: seed 000's duplicate results), ties broken by id so the answer does not depend on
//! which child answered first. A plain library: it exports no component of its own.

#![no_std]

extern crate alloc;

use alloc::collections::{BTreeSet, BinaryHeap};
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::{Ordering, Reverse};
pub use policy_packed::{Hit, Part, pack_hits as pack, parts};

/// The largest `k` accepted, so one call's output stays bounded.
pub const MAX_K: u32 = 100_000;

/// A hit ordered by (distance, id), nearest first; with where it came from.
struct Head {
    distance: f32,
    id: u64,
    part: usize,
    position: usize,
}

impl Head {
    fn key(&self) -> (f32, u64) {
        (self.distance, self.id)
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        let (a, b) = (self.key(), other.key());
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
    }
}

pub fn merge(k: u32, mut parts: Vec<Part>) -> Result<Vec<Hit>, String> {
    if k > MAX_K {
        return Err(format!("k is {k}; at most {MAX_K}"));
    }
    for part in &mut parts {
        if let Some(bad) = part.hits.iter().find(|h| h.distance.is_nan()) {
            return Err(format!(
                "child {} answered id {} with a NaN distance",
                part.child, bad.id
            ));
        }
        // Children should answer nearest first; sorting again is cheap and makes sure of it.
        part.hits
            .sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
    }
    let mut heads: BinaryHeap<Reverse<Head>> = parts
        .iter()
        .enumerate()
        .filter_map(|(part, p)| {
            p.hits.first().map(|hit| {
                Reverse(Head {
                    distance: hit.distance,
                    id: hit.id,
                    part,
                    position: 0,
                })
            })
        })
        .collect();
    let mut merged = Vec::with_capacity(k as usize);
    // A BTreeSet, not a HashSet: std's hasher seeds itself from the host's randomness, which a
    // policy is never granted.
    let mut seen = BTreeSet::new();
    while merged.len() < k as usize {
        let Some(Reverse(head)) = heads.pop() else {
            break;
        };
        if seen.insert(head.id) {
            merged.push(Hit {
                id: head.id,
                distance: head.distance,
            });
        }
        let next = head.position + 1;
        if let Some(hit) = parts[head.part].hits.get(next) {
            heads.push(Reverse(Head {
                distance: hit.distance,
                id: hit.id,
                part: head.part,
                position: next,
            }));
        }
    }
    Ok(merged)
}

/// Sorts hits by (distance, id) and keeps each id's first (nearest) hit.
pub fn sort_unique(hits: &mut Vec<Hit>) {
    hits.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
    let mut seen = BTreeSet::new();
    hits.retain(|hit| seen.insert(hit.id));
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use alloc::vec;

    fn part(child: u32, hits: &[(u64, f32)]) -> Part {
        Part {
            child,
            weight: 1.0,
            hits: hits
                .iter()
                .map(|&(id, distance)| Hit { id, distance })
                .collect(),
        }
    }

    fn ids(hits: &[Hit]) -> Vec<u64> {
        hits.iter().map(|h| h.id).collect()
    }

    #[test]
    fn merges_nearest_first_dedups_and_breaks_ties_by_id() {
        let parts = vec![
            part(0, &[(5, 0.1), (9, 0.4), (2, 0.9)]),
            part(1, &[(7, 0.2), (5, 0.1), (3, 0.4)]),
            part(2, &[]),
        ];
        let merged = merge(4, parts).unwrap();
        // 5 appears in two shards and counts once; 3 and 9 tie at 0.4 and 3 comes first.
        assert_eq!(ids(&merged), [5, 7, 3, 9]);
        assert!(merged.windows(2).all(|w| w[0].distance <= w[1].distance));
    }

    #[test]
    fn short_inputs_give_short_answers_and_order_never_matters() {
        let a = part(0, &[(1, 0.5), (2, 0.5)]);
        let b = part(1, &[(2, 0.5), (0, 0.5)]);
        let forward = merge(10, vec![a.clone(), b.clone()]).unwrap();
        let backward = merge(10, vec![b, a]).unwrap();
        assert_eq!(ids(&forward), [0, 1, 2]);
        assert_eq!(ids(&forward), ids(&backward));
        assert!(merge(0, vec![part(0, &[(1, 0.1)])]).unwrap().is_empty());
        assert!(merge(3, Vec::new()).unwrap().is_empty());
    }

    #[test]
    fn packed_hits_unpack_into_one_part_per_run_of_a_child() {
        let mut words = Vec::new();
        for (child, id, distance) in [(0, 1, 0.1), (0, 2, 0.2), (3, 9, 0.05)] {
            Hit { id, distance }.write_part(child, &mut words);
        }
        let unpacked = parts(&[0.5], &words).unwrap();
        assert_eq!(unpacked.len(), 2);
        assert_eq!(
            (
                unpacked[0].child,
                unpacked[0].weight,
                unpacked[0].hits.len()
            ),
            (0, 0.5, 2)
        );
        assert_eq!(
            (
                unpacked[1].child,
                unpacked[1].weight,
                unpacked[1].hits.len()
            ),
            (3, 1.0, 1)
        );
        assert!(parts(&[], &words[..3]).is_err());
    }

    #[test]
    fn unsorted_children_nan_and_huge_k_are_handled() {
        let merged = merge(2, vec![part(0, &[(8, 0.9), (4, 0.3), (6, 0.1)])]).unwrap();
        assert_eq!(ids(&merged), [6, 4]);
        assert!(merge(2, vec![part(3, &[(1, f32::NAN)])]).is_err());
        assert!(merge(MAX_K + 1, Vec::new()).is_err());
    }
}
