//! Merge experiments judged by recall. For each search merged while a merge experiment runs,
//! live or shadow, every variant merges the same children's hits; each answer is scored
//! against the exact merge of those hits (their top-k by distance, each id once: every shard
//! answered its own top-k, so their union holds the true top-k of what was searched) and
//! against the baseline variant's answer, and its call is timed. The scores of the first
//! `MAX_SCORED_SEARCHES` searches are kept in memory, a row per search, so every variant is
//! judged on the same searches and a difference is taken search by search.

use super::checks;
use super::instance::MergeInstance;
use super::metrics::PolicyMetrics;
use super::trial::Trial;
use policy_packed::Hit;
use serde::Serialize;
use sluice_stats::means::{MeanFigure, paired_verdict};
use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Searches scored per experiment; past it searches are only counted. A row holds a score per
/// variant (16 bytes each), so the bound is at most 640 KB for eight variants, and a report's
/// bootstrap draws stay below a few million per figure.
pub const MAX_SCORED_SEARCHES: usize = 5_000;

/// One variant's merge of one search.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Score {
    /// Share of the exact top-k it answered.
    recall: f32,
    /// Ids it shares with the baseline variant's answer, over the larger of the two answers
    /// (1 when both are empty; 0 when the baseline could not merge).
    overlap: f32,
    hits: u32,
    merge_us: u32,
}

/// The scored searches of one experiment: per search, a score per variant (none: that
/// variant faulted or refused).
#[derive(Default)]
pub struct MergeScores {
    rows: Mutex<Vec<Vec<Option<Score>>>>,
    unscored_total: AtomicU64,
}

/// What one variant's merges scored, as a report shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MergeFigures {
    /// Searches it merged and was scored on; past `MAX_SCORED_SEARCHES`, `unscored` more.
    pub searches: u64,
    pub unscored: u64,
    /// Merges that faulted or refused (not scored).
    pub failed: u64,
    /// The share of the exact top-k of the same hits it answered, averaged over searches.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub recall_at_k: MeanFigure,
    /// Ids shared with the baseline (first) variant's answer over the larger answer, averaged.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub overlap_at_k: MeanFigure,
    /// Hits per answer, averaged.
    pub hits_mean: f64,
    /// Time of one merge call into its component, in µs.
    pub merge_us_p50: u64,
    pub merge_us_p99: u64,
    /// Against the baseline: the mean of its recall minus the baseline's, search by search,
    /// and the verdict (none for the baseline itself).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub recall_difference: Option<MeanFigure>,
    pub verdict: Option<String>,
}

impl MergeFigures {
    /// One line, as reports and `sluice sim --merge` print it.
    pub fn line(&self) -> String {
        format!(
            "merges scored {} (failed {}, past the bound {}): recall@k {}, overlap@k with the \
             baseline {}, hits {:.2}, merge p50 {} µs, p99 {} µs",
            self.searches,
            self.failed,
            self.unscored,
            self.recall_at_k.describe(),
            self.overlap_at_k.describe(),
            self.hits_mean,
            self.merge_us_p50,
            self.merge_us_p99,
        )
    }
}

fn ids(hits: &[Hit]) -> HashSet<u64> {
    hits.iter().map(|h| h.id).collect()
}

/// |a ∩ b| / |b|, 1 when `b` is empty.
fn share_of(a: &HashSet<u64>, b: &HashSet<u64>) -> f32 {
    if b.is_empty() {
        return 1.0;
    }
    a.intersection(b).count() as f32 / b.len() as f32
}

impl Trial<MergeInstance> {
    /// Every variant merges `hits` (the children's packed hits, `weights` theirs) for `k`, and
    /// each answer is scored; nothing is decided here.
    pub fn score_merges(&self, k: u32, weights: &[f32], hits: &[u64], metrics: &PolicyMetrics) {
        let full = self
            .scores
            .rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            >= MAX_SCORED_SEARCHES;
        if full {
            self.scores.unscored_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let equal = vec![1.0; weights.len()];
        let Ok(exact) = sluice_engine::native_merge(k, &equal, hits) else {
            return;
        };
        let exact: Vec<Hit> = exact
            .into_iter()
            .map(|h| Hit {
                id: h.id,
                distance: h.distance,
            })
            .collect();
        let exact = ids(&exact);
        let answers: Vec<Option<(HashSet<u64>, u32)>> = self
            .arms
            .iter()
            .map(|arm| {
                let loaded = arm.loaded.as_ref()?;
                let started = Instant::now();
                let outcome = loaded.run(
                    &mut |p: &mut MergeInstance| p.merge(k, weights, hits),
                    &|answer| checks::merged(k, hits, answer),
                );
                let merge_us = u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX);
                loaded.metrics_in(metrics).record(None, outcome.is_err());
                match outcome {
                    Ok(Ok(answer)) => Some((ids(&answer), merge_us)),
                    _ => None,
                }
            })
            .collect();
        let baseline = answers.first().and_then(|a| a.as_ref()).map(|(ids, _)| ids);
        let row: Vec<Option<Score>> = answers
            .iter()
            .map(|answer| {
                let (answered, merge_us) = answer.as_ref()?;
                Some(Score {
                    recall: share_of(answered, &exact),
                    overlap: match baseline {
                        Some(baseline) if baseline.is_empty() && answered.is_empty() => 1.0,
                        Some(baseline) => {
                            let larger = baseline.len().max(answered.len());
                            answered.intersection(baseline).count() as f32 / larger as f32
                        }
                        None => 0.0,
                    },
                    hits: answered.len() as u32,
                    merge_us: *merge_us,
                })
            })
            .collect();
        let mut rows = self.scores.rows.lock().unwrap_or_else(|p| p.into_inner());
        if rows.len() < MAX_SCORED_SEARCHES {
            rows.push(row);
        } else {
            self.scores.unscored_total.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl MergeScores {
    /// Each variant's figures, in the order of `names`; none when no search was scored. The
    /// intervals' seeds depend on the variant's place only, so the same searches scored give
    /// the same figures in any experiment (live or shadow) and in any order.
    pub fn figures(&self, names: &[&str]) -> Option<Vec<MergeFigures>> {
        const SEED: u64 = 0x6d65_7267_6521;
        // A copy, so the writer's scoring never waits on a report's bootstrap.
        let rows = self.rows.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if rows.is_empty() {
            return None;
        }
        let unscored = self.unscored_total.load(Ordering::Relaxed);
        let column = |arm: usize| {
            rows.iter()
                .filter_map(move |row| row.get(arm).copied().flatten())
        };
        Some(
            (0..names.len())
                .map(|arm| {
                    let scores: Vec<Score> = column(arm).collect();
                    let seed = SEED ^ (arm as u64) << 32;
                    let recalls: Vec<f64> = scores.iter().map(|s| f64::from(s.recall)).collect();
                    let overlaps: Vec<f64> = scores.iter().map(|s| f64::from(s.overlap)).collect();
                    let mut merge_us: Vec<u64> =
                        scores.iter().map(|s| u64::from(s.merge_us)).collect();
                    merge_us.sort_unstable();
                    let hits: u64 = scores.iter().map(|s| u64::from(s.hits)).sum();
                    let (recall_difference, verdict) = if arm == 0 {
                        (None, None)
                    } else {
                        let differences: Vec<f64> = rows
                            .iter()
                            .filter_map(|row| match (row.first()?, row.get(arm)?) {
                                (Some(base), Some(this)) => {
                                    Some(f64::from(this.recall) - f64::from(base.recall))
                                }
                                _ => None,
                            })
                            .collect();
                        let difference = MeanFigure::of(&differences, seed ^ 1);
                        let verdict = paired_verdict(names[arm], "recall@k", &difference);
                        (Some(difference), Some(verdict))
                    };
                    MergeFigures {
                        searches: scores.len() as u64,
                        unscored,
                        failed: (rows.len() - scores.len()) as u64,
                        recall_at_k: MeanFigure::of(&recalls, seed),
                        overlap_at_k: MeanFigure::of(&overlaps, seed ^ 2),
                        hits_mean: if scores.is_empty() {
                            0.0
                        } else {
                            (hits as f64 / scores.len() as f64 * 100.0).round() / 100.0
                        },
                        merge_us_p50: sluice_stats::quantile(&merge_us, 0.5),
                        merge_us_p99: sluice_stats::quantile(&merge_us, 0.99),
                        recall_difference,
                        verdict,
                    }
                })
                .collect(),
        )
    }
}
