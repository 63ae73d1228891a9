//! Merge strategies over recorded searches (`sluice sim --merge`). Each search a trace holds
//! with its children's hits (`sluice trace export --with-hits`) is merged by every variant —
//! the real components, uploaded to a registry in memory and checked as a server checks them —
//! and scored as a merge experiment on a server scores it (a shadow experiment runs in that
//! registry), so the same searches give the same recall and overlap figures offline as live.

use super::{PolicyChoice, ReplayError};
use crate::trace::{TraceError, TraceTask};
use sluice_model::{AssignBy, ExperimentMode, ExperimentSpec, PolicyKind, VariantSpec};
use sluice_policy_runtime::{
    MergeFigures, PolicyRegistry, PolicyRuntime, RegistryOptions, RuntimeOptions,
};
use sluice_store::MemoryCatalog;
use std::str::FromStr;
use std::sync::Arc;

/// The registry's clock: uploads and the experiment are stamped with it; merges read no time.
const START_MS: u64 = 1_700_000_000_000;

/// One variant: a name and its merge component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergeVariant {
    pub name: String,
    pub choice: PolicyChoice,
}

impl FromStr for MergeVariant {
    type Err = ReplayError;

    /// `NAME=builtin:NAME[?a=1&b=2]` or `NAME=FILE.wasm[?...]`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (name, component) = text.split_once('=').ok_or_else(|| ReplayError::Choice {
            choice: text.chars().take(200).collect(),
            detail: "expected NAME=builtin:NAME or NAME=FILE.wasm".into(),
        })?;
        Ok(MergeVariant {
            name: name.to_owned(),
            choice: format!("merge={component}").parse()?,
        })
    }
}

/// What the comparison found.
#[derive(Debug)]
pub struct MergeComparison {
    /// Trace lines with a recorded search, and without (not merged).
    pub searches: u64,
    pub other_tasks: u64,
    /// Each variant's figures, in order; the first is the baseline.
    pub variants: Vec<(String, MergeFigures)>,
}

/// Merges every recorded search of `trace` with each of `variants` (1 to 8, the first the
/// baseline) and scores them.
pub fn compare(
    trace: impl Iterator<Item = Result<TraceTask, TraceError>>,
    variants: &[MergeVariant],
) -> Result<MergeComparison, ReplayError> {
    let runtime = Arc::new(PolicyRuntime::new(RuntimeOptions::default())?);
    let catalog = Arc::new(MemoryCatalog::new());
    let registry = PolicyRegistry::open(runtime, catalog, RegistryOptions::default())?;
    let mut specs = Vec::with_capacity(variants.len());
    for variant in variants {
        let choice = &variant.choice;
        let uploaded = registry
            .upload(
                PolicyKind::Merge,
                &choice.bytes()?,
                choice.config.clone(),
                START_MS,
            )
            .map_err(|error| ReplayError::Load {
                choice: choice.to_string(),
                detail: error.to_string(),
            })?;
        specs.push(VariantSpec {
            name: variant.name.clone(),
            version: uploaded.version.version,
            weight: 1,
        });
    }
    let spec = ExperimentSpec {
        kind: PolicyKind::Merge,
        variants: specs,
        assign_by: AssignBy::Task,
        mode: ExperimentMode::Shadow,
    };
    spec.check().map_err(|detail| ReplayError::Choice {
        choice: "--merge".into(),
        detail,
    })?;
    let experiment = registry.start_experiment(spec, START_MS)?;
    let (mut searches, mut other_tasks) = (0, 0);
    let mut packed = Vec::new();
    for task in trace {
        let Some(search) = task?.search else {
            other_tasks += 1;
            continue;
        };
        searches += 1;
        packed.clear();
        for (child, recorded) in (0u32..).zip(&search.children) {
            for hit in &recorded.hits {
                policy_packed::Hit {
                    id: hit.id,
                    distance: hit.distance,
                }
                .write_part(child, &mut packed);
            }
        }
        let weights: Vec<f32> = search.children.iter().map(|c| c.weight).collect();
        registry.merge(START_MS, None, search.k, &weights, &packed)?;
    }
    let figures = registry.variant_figures(&experiment).unwrap_or_default();
    Ok(MergeComparison {
        searches,
        other_tasks,
        variants: variants
            .iter()
            .zip(figures)
            .map(|(variant, arm)| (variant.name.clone(), arm.merge.unwrap_or_default()))
            .collect(),
    })
}
