//! Seeded data for the demo and the recall tests: clustered vectors (as real embeddings are),
//! and the exact brute-force answer every split and merge is measured against.

use super::Vectors;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_model::{Hit, Metric};

/// `rows` vectors of `dim` numbers around `clusters` random centres, seeded.
pub fn clustered(rows: usize, dim: usize, clusters: usize, seed: u64) -> Vectors {
    let mut random = SmallRng::seed_from_u64(seed);
    let centres: Vec<f32> = (0..clusters.max(1) * dim)
        .map(|_| random.random_range(-10.0..10.0))
        .collect();
    let mut data = Vec::with_capacity(rows * dim);
    for _ in 0..rows {
        let centre = random.random_range(0..clusters.max(1));
        for d in 0..dim {
            let noise: f32 = random.random_range(-1.0..1.0) + random.random_range(-1.0..1.0);
            data.push(centres[centre * dim + d] + noise);
        }
    }
    Vectors { dim, data }
}

/// The exact `k` nearest of `vectors` (ids = row numbers) by (distance, id).
pub fn brute_force(vectors: &Vectors, query: &[f32], k: usize, metric: Metric) -> Vec<Hit> {
    let mut all: Vec<Hit> = (0..vectors.len())
        .map(|row| Hit {
            id: row as u64,
            distance: metric.distance(query, vectors.row(row)),
        })
        .collect();
    all.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
    all.truncate(k);
    all
}
