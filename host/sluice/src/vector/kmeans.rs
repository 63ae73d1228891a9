//! IVF lists: k-means centroids (seeded, so a demo or a test builds the same lists every run)
//! and each vector's nearest centroid. The `split-ivf` policy probes by the same L2 rule and
//! the same tie-break (lower list first), so a worker's lists match the policy's.

use rand::rngs::SmallRng;
use rand::seq::index::sample;
use rand::{Rng, SeedableRng};

/// The list of the centroid nearest `vector` (L2; ties to the lower list).
pub fn nearest_list(vector: &[f32], centroids: &[f32]) -> u32 {
    let dim = vector.len().max(1);
    let mut best = (f32::INFINITY, 0u32);
    for (centroid, list) in centroids.chunks_exact(dim).zip(0u32..) {
        let d: f32 = centroid
            .iter()
            .zip(vector)
            .map(|(c, x)| (c - x) * (c - x))
            .sum();
        if d < best.0 {
            best = (d, list);
        }
    }
    best.1
}

/// Each row's nearest centroid.
pub fn assign(data: &[f32], dim: usize, centroids: &[f32]) -> Vec<u32> {
    data.chunks_exact(dim.max(1))
        .map(|row| nearest_list(row, centroids))
        .collect()
}

/// `lists` centroids of `data` by Lloyd's algorithm from `iterations` rounds, seeded.
pub fn kmeans(data: &[f32], dim: usize, lists: usize, iterations: usize, seed: u64) -> Vec<f32> {
    let rows = data.len() / dim.max(1);
    let lists = lists.min(rows).max(1);
    let mut random = SmallRng::seed_from_u64(seed);
    let mut centroids: Vec<f32> = sample(&mut random, rows, lists)
        .into_iter()
        .flat_map(|row| data[row * dim..(row + 1) * dim].iter().copied())
        .collect();
    for _ in 0..iterations {
        let assigned = assign(data, dim, &centroids);
        let mut sums = vec![0f64; lists * dim];
        let mut counts = vec![0usize; lists];
        for (row, &list) in data.chunks_exact(dim).zip(&assigned) {
            counts[list as usize] += 1;
            for (sum, x) in sums[list as usize * dim..].iter_mut().zip(row) {
                *sum += f64::from(*x);
            }
        }
        for list in 0..lists {
            let target = &mut centroids[list * dim..(list + 1) * dim];
            if counts[list] == 0 {
                // An empty list restarts at a random vector rather than staying useless.
                let row = random.random_range(0..rows);
                target.copy_from_slice(&data[row * dim..(row + 1) * dim]);
            } else {
                for (c, sum) in target.iter_mut().zip(&sums[list * dim..]) {
                    *c = (*sum / counts[list] as f64) as f32;
                }
            }
        }
    }
    centroids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_clear_clusters_get_two_centroids_and_ties_go_low() {
        let data = [0.0, 0.1, 0.2, 10.0, 10.1, 10.2];
        let centroids = kmeans(&data, 1, 2, 10, 7);
        let mut sorted = centroids.clone();
        sorted.sort_by(f32::total_cmp);
        assert!((sorted[0] - 0.1).abs() < 1e-4 && (sorted[1] - 10.1).abs() < 1e-4);
        assert_eq!(kmeans(&data, 1, 2, 10, 7), centroids);
        assert_eq!(nearest_list(&[5.0], &[4.0, 6.0]), 0);
        assert_eq!(assign(&[0.0, 9.0], 1, &[0.0, 10.0]), [0, 1]);
    }
}
