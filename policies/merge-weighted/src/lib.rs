//! Merge policy: top-k over distances scaled by each child's weight from the split, so a
//! trusted or fresher shard can rank ahead of others at equal distance. A weight above 1
//! favours a child: a distance d ≥ 0 becomes d / w, a negative one (inner product) d × w. A
//! child of weight 0 is left out. Each id once, ties broken by id; the answer carries the
//! scaled distances.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use merge_core::{Hit, Part};

/// A distance as a child of weight `weight` counts it (`weight` > 0).
pub fn scaled(distance: f32, weight: f32) -> f32 {
    if distance >= 0.0 {
        distance / weight
    } else {
        distance * weight
    }
}

pub fn merge(k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String> {
    let weighted = parts
        .into_iter()
        .filter(|part| part.weight > 0.0)
        .map(|mut part| {
            for hit in &mut part.hits {
                hit.distance = scaled(hit.distance, part.weight);
            }
            part
        })
        .collect();
    merge_core::merge(k, weighted)
}

/// The policy: it takes no settings.
pub struct Policy;

impl sluice_policy::Merge for Policy {
    fn init(_config: &sluice_policy::Config) -> Result<Self, String> {
        Ok(Policy)
    }

    fn merge(&self, k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String> {
        merge(k, parts)
    }
}

sluice_policy::merge_policy!(Policy, settings = []);

#[cfg(test)]
mod tests {
    use super::*;

    fn part(child: u32, weight: f32, hits: &[(u64, f32)]) -> Part {
        Part {
            child,
            weight,
            hits: hits
                .iter()
                .map(|&(id, distance)| Hit { id, distance })
                .collect(),
        }
    }

    #[test]
    fn a_heavier_child_ranks_ahead_and_a_zero_weight_child_is_left_out() {
        let parts = vec![
            part(0, 1.0, &[(1, 1.0), (2, 3.0)]),
            part(1, 2.0, &[(7, 1.5), (8, 4.0)]),
            part(2, 0.0, &[(9, 0.0)]),
        ];
        let merged = merge(3, parts).unwrap();
        let ids: Vec<u64> = merged.iter().map(|h| h.id).collect();
        // 7 scales to 0.75, 8 to 2.0; 9 is never seen.
        assert_eq!(ids, [7, 1, 8]);
        assert_eq!(merged[0].distance, 0.75);
    }

    #[test]
    fn negative_distances_scale_the_favoured_way() {
        assert!(scaled(-1.0, 2.0) < scaled(-1.0, 1.0));
        assert!(scaled(1.0, 2.0) < scaled(1.0, 1.0));
    }
}
