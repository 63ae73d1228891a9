//! Experiments of policy versions: what a researcher asks for (kind, variants, how tasks are
//! assigned, live or shadow), the stored record, the variant tag a task carries, and the
//! stable hash that assigns it.

use super::PolicyKind;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Variants one experiment may compare.
pub const MAX_VARIANTS: usize = 8;
/// The longest variant name.
pub const MAX_VARIANT_NAME_BYTES: usize = 32;
/// The largest weight of one variant; weights are shares of their sum.
pub const MAX_WEIGHT: u32 = 10_000;
/// Experiments a server keeps records of; past it, new ones are refused.
pub const MAX_EXPERIMENTS: usize = 1_000;

/// What picks a task's variant: its own arrival (each task on its own), its device, or its
/// tenant (every task of one device or tenant in the same variant).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum AssignBy {
    #[default]
    Task,
    Device,
    Tenant,
}

/// Live: each variant decides for the tasks assigned to it. Shadow: the active version
/// decides for every task and the variants decide beside it, unheeded, to be compared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ExperimentMode {
    #[default]
    Live,
    Shadow,
}

/// One arm of an experiment: a stored version of the kind (0: the built-in one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VariantSpec {
    pub name: String,
    pub version: u32,
    /// Its share of the tasks, against the other weights (live only); 1 by default.
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// `POST /v1/experiments`'s body.
#[derive(Clone, Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExperimentSpec {
    pub kind: PolicyKind,
    /// The first variant is the baseline the report compares the others against.
    pub variants: Vec<VariantSpec>,
    #[serde(default)]
    pub assign_by: AssignBy,
    #[serde(default)]
    pub mode: ExperimentMode,
}

impl ExperimentSpec {
    /// Everything that can be judged without the registry: counts, names, weights, and the
    /// kinds each mode supports.
    pub fn check(&self) -> Result<(), String> {
        let supported = match self.mode {
            ExperimentMode::Live => &[
                PolicyKind::Priority,
                PolicyKind::Aging,
                PolicyKind::Retry,
                PolicyKind::Merge,
            ][..],
            ExperimentMode::Shadow => &[
                PolicyKind::Priority,
                PolicyKind::Aging,
                PolicyKind::Retry,
                PolicyKind::Merge,
            ][..],
        };
        if !supported.contains(&self.kind) {
            let names: Vec<&str> = supported.iter().map(|k| k.as_str()).collect();
            return Err(format!(
                "a {} experiment of the {} policy is not supported; {} experiments run on: {}",
                mode_name(self.mode),
                self.kind,
                mode_name(self.mode),
                names.join(", ")
            ));
        }
        let count = self.variants.len();
        let least = match self.mode {
            ExperimentMode::Live => 2,
            ExperimentMode::Shadow => 1,
        };
        if !(least..=MAX_VARIANTS).contains(&count) {
            return Err(format!(
                "a {} experiment has {least} to {MAX_VARIANTS} variants; this one has {count}",
                mode_name(self.mode)
            ));
        }
        for (i, variant) in self.variants.iter().enumerate() {
            let name_ok = !variant.name.is_empty()
                && variant.name.len() <= MAX_VARIANT_NAME_BYTES
                && variant
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
            if !name_ok {
                return Err(format!(
                    "variant {i}: a name is 1 to {MAX_VARIANT_NAME_BYTES} ASCII letters, digits, `.`, `_` or `-`"
                ));
            }
            if self.variants[..i].iter().any(|v| v.name == variant.name) {
                return Err(format!("variant name `{}` is used twice", variant.name));
            }
            if !(1..=MAX_WEIGHT).contains(&variant.weight) {
                return Err(format!(
                    "variant `{}`: a weight is 1 to {MAX_WEIGHT}",
                    variant.name
                ));
            }
        }
        Ok(())
    }
}

fn mode_name(mode: ExperimentMode) -> &'static str {
    match mode {
        ExperimentMode::Live => "live",
        ExperimentMode::Shadow => "shadow",
    }
}

/// How an experiment ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum ExperimentEnd {
    Stopped,
    /// The variant was made the active version of its kind.
    Promoted {
        variant: String,
        version: u32,
        /// A rollout's last step: how each guard was judged.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        judged: Vec<String>,
    },
    /// A rollout's step whose guards held (`judged`: how each was judged); its next step is
    /// another experiment.
    Advanced {
        judged: Vec<String>,
    },
    /// A rollout's step whose guard failed: the baseline decides for every task again.
    RolledBack {
        /// The guard that failed, as written.
        guard: String,
        /// Which guard failed and by how much.
        reason: String,
        judged: Vec<String>,
    },
}

/// An experiment as stored in the policy catalog.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Experiment {
    pub id: u32,
    pub kind: PolicyKind,
    pub variants: Vec<VariantSpec>,
    pub assign_by: AssignBy,
    pub mode: ExperimentMode,
    pub started_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<ExperimentEnd>,
    /// Set when the experiment is a step of a guarded rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::RolloutStep>,
}

impl Experiment {
    pub fn is_running(&self) -> bool {
        self.ended_at_ms.is_none()
    }

    /// The variant of the task whose assignment key is `key`: a stable hash (SHA-256, the
    /// same on every machine and release) of the experiment's id and the key, placed on the
    /// variants' cumulative weights. The id is hashed in so that one device is not in the
    /// first variant of every experiment.
    pub fn assign(&self, key: &[u8]) -> u8 {
        let total: u64 = self.variants.iter().map(|v| u64::from(v.weight)).sum();
        if total == 0 {
            return 0;
        }
        let digest = Sha256::new()
            .chain_update(self.id.to_be_bytes())
            .chain_update(key)
            .finalize();
        let mut word = [0u8; 8];
        word.copy_from_slice(&digest[..8]);
        let mut point = u64::from_be_bytes(word) % total;
        for (index, variant) in self.variants.iter().enumerate() {
            let weight = u64::from(variant.weight);
            if point < weight {
                return index as u8;
            }
            point -= weight;
        }
        debug_assert!(false, "a point below the total falls in some variant");
        0
    }

    /// One line for the policy log: the variants and how tasks are assigned.
    pub fn describe(&self) -> String {
        let variants: Vec<String> = self
            .variants
            .iter()
            .map(|v| format!("{}=v{}×{}", v.name, v.version, v.weight))
            .collect();
        format!(
            "experiment {} ({}, by {}): {}",
            self.id,
            mode_name(self.mode),
            match self.assign_by {
                AssignBy::Task => "task",
                AssignBy::Device => "device",
                AssignBy::Tenant => "tenant",
            },
            variants.join(", ")
        )
    }
}

/// The variant of a running experiment a task was assigned to, kept on the task for life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VariantTag {
    pub kind: PolicyKind,
    pub experiment: u32,
    /// Its index among the experiment's variants.
    pub variant: u8,
}

/// A task's variant tags, at most one per kind: `Copy`, as the rest of an admission.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Assignments([Option<VariantTag>; PolicyKind::ALL.len()]);

impl Assignments {
    pub fn get(&self, kind: PolicyKind) -> Option<VariantTag> {
        self.0[kind.code() as usize]
    }

    pub fn set(&mut self, tag: VariantTag) {
        self.0[tag.kind.code() as usize] = Some(tag);
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    pub fn tags(&self) -> impl Iterator<Item = VariantTag> + '_ {
        self.0.iter().flatten().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment(weights: &[u32]) -> Experiment {
        Experiment {
            id: 7,
            kind: PolicyKind::Aging,
            variants: weights
                .iter()
                .enumerate()
                .map(|(i, &weight)| VariantSpec {
                    name: format!("v{i}"),
                    version: i as u32,
                    weight,
                })
                .collect(),
            assign_by: AssignBy::Device,
            mode: ExperimentMode::Live,
            started_at_ms: 0,
            ended_at_ms: None,
            end: None,
            rollout: None,
        }
    }

    #[test]
    fn assignment_is_stable_and_follows_the_weights() {
        let even = experiment(&[1, 1]);
        let mut counts = [0u32; 2];
        for device in 0..10_000 {
            let key = format!("scanner-{device}");
            let variant = even.assign(key.as_bytes());
            assert_eq!(variant, even.assign(key.as_bytes()), "sticky");
            counts[variant as usize] += 1;
        }
        // 10,000 fair coin flips land within 4.5 standard deviations (150) of 5,000.
        assert!(counts[0].abs_diff(5_000) < 225, "{counts:?}");
        let skewed = experiment(&[9, 1]);
        let second = (0..10_000u32)
            .filter(|i| skewed.assign(&i.to_be_bytes()) == 1)
            .count();
        assert!(second.abs_diff(1_000) < 150, "{second}");
        // Another experiment shuffles the keys anew.
        let mut other = even.clone();
        other.id = 8;
        let moved = (0..1_000u32)
            .filter(|i| other.assign(&i.to_be_bytes()) != even.assign(&i.to_be_bytes()))
            .count();
        assert!((350..650).contains(&moved), "{moved}");
    }

    #[test]
    fn a_spec_is_checked_before_anything_is_loaded() {
        let spec = |kind, mode, variants: &[(&str, u32)]| ExperimentSpec {
            kind,
            mode,
            assign_by: AssignBy::Task,
            variants: variants
                .iter()
                .map(|&(name, weight)| VariantSpec {
                    name: name.into(),
                    version: 0,
                    weight,
                })
                .collect(),
        };
        let live = ExperimentMode::Live;
        assert!(
            spec(PolicyKind::Aging, live, &[("a", 1), ("b", 1)])
                .check()
                .is_ok()
        );
        let refusals = [
            spec(PolicyKind::Split, live, &[("a", 1), ("b", 1)]),
            spec(PolicyKind::Aging, live, &[("a", 1)]),
            spec(PolicyKind::Aging, live, &[("a", 1), ("a", 1)]),
            spec(PolicyKind::Aging, live, &[("a", 0), ("b", 1)]),
            spec(PolicyKind::Aging, live, &[("a b", 1), ("b", 1)]),
        ];
        for refused in refusals {
            assert!(refused.check().is_err(), "{refused:?}");
        }
        assert!(
            spec(PolicyKind::Retry, ExperimentMode::Shadow, &[("a", 1)])
                .check()
                .is_ok()
        );
    }
}
