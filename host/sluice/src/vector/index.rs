//! One worker's part of a vector set and the exact search over it: the k nearest of the
//! vectors a child's filter selects, ordered by (distance, id) so that ties never depend on
//! the order vectors were loaded in.

use super::Vectors;
use sluice_model::{Hit, ShardAnswer, ShardFilter, ShardQuery};
use std::collections::BinaryHeap;

/// Which stored shard a worker holds: shard `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardPart {
    pub index: u32,
    pub count: u32,
}

impl ShardPart {
    /// Parses `I/N`.
    pub fn parse(text: &str) -> Result<ShardPart, String> {
        let (index, count) = text
            .split_once('/')
            .ok_or_else(|| format!("`{text}` is not I/N"))?;
        let part = ShardPart {
            index: index
                .trim()
                .parse()
                .map_err(|_| format!("bad shard `{index}`"))?,
            count: count
                .trim()
                .parse()
                .map_err(|_| format!("bad count `{count}`"))?,
        };
        if part.count == 0 || part.index >= part.count {
            return Err(format!("shard {text}: I must be below N, and N at least 1"));
        }
        Ok(part)
    }

    /// The rows of a set of `rows` this shard holds: a contiguous range, the shards' sizes
    /// differing by at most one.
    pub fn rows(&self, rows: usize) -> std::ops::Range<usize> {
        let (i, n) = (self.index as usize, self.count as usize);
        rows * i / n..rows * (i + 1) / n
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SearchError {
    #[error("the query has {query} dimensions; this shard holds {held}")]
    Dimensions { query: usize, held: usize },
    #[error("the query is for {asked}, and this worker holds {held}")]
    WrongShard { asked: String, held: String },
    #[error("an IVF query needs list assignments: start the worker with --centroids")]
    NoLists,
}

#[derive(Clone, Debug)]
pub struct ShardIndex {
    pub dim: usize,
    ids: Vec<u64>,
    data: Vec<f32>,
    /// Each vector's IVF list, when centroids were given.
    lists: Option<Vec<u32>>,
    /// The stored shard held; none for the whole set.
    part: Option<ShardPart>,
}

impl ShardIndex {
    /// Vectors with explicit ids (a shard may hold copies of another's vectors).
    pub fn new(dim: usize, ids: Vec<u64>, data: Vec<f32>, part: Option<ShardPart>) -> Self {
        ShardIndex {
            dim,
            ids,
            data,
            lists: None,
            part,
        }
    }

    /// The rows of `vectors` that `part` holds (all of them without a part), ids = row numbers.
    pub fn from_rows(vectors: &Vectors, part: Option<ShardPart>) -> Self {
        let rows = match part {
            Some(part) => part.rows(vectors.len()),
            None => 0..vectors.len(),
        };
        let data = vectors.data[rows.start * vectors.dim..rows.end * vectors.dim].to_vec();
        ShardIndex::new(vectors.dim, rows.map(|r| r as u64).collect(), data, part)
    }

    /// Assigns each vector to its nearest centroid, for IVF queries.
    pub fn with_lists(mut self, centroids: &Vectors) -> Result<Self, SearchError> {
        if centroids.dim != self.dim {
            return Err(SearchError::Dimensions {
                query: centroids.dim,
                held: self.dim,
            });
        }
        self.lists = Some(super::assign(&self.data, self.dim, &centroids.data));
        Ok(self)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// What this worker holds, for messages and its routing label.
    pub fn holds(&self) -> String {
        match self.part {
            Some(part) => format!("shard {}", part.index),
            None => "the whole set".to_owned(),
        }
    }

    /// The routing label value a child must carry for this worker: see `ShardFilter::routing`
    /// (the only shard of one is the whole set).
    pub fn routing(&self) -> String {
        match self.part {
            Some(part) if part.count > 1 => part.index.to_string(),
            _ => "all".to_owned(),
        }
    }

    /// The shard it holds as its heartbeat announces it: (index, count), (0, 1) for the whole
    /// set.
    pub fn shard_of(&self) -> (u32, u32) {
        self.part.map_or((0, 1), |part| (part.index, part.count))
    }

    pub fn search(&self, query: &ShardQuery) -> Result<ShardAnswer, SearchError> {
        if query.vector.len() != self.dim {
            return Err(SearchError::Dimensions {
                query: query.vector.len(),
                held: self.dim,
            });
        }
        let wrong_shard = || SearchError::WrongShard {
            asked: query.filter.describe(),
            held: self.holds(),
        };
        let lists: Option<&[u32]> = match &query.filter {
            ShardFilter::Shard(shard) => {
                if self.shard_of().0 != *shard {
                    return Err(wrong_shard());
                }
                None
            }
            ShardFilter::Centroids(lists) => {
                if self.part.is_some() {
                    return Err(wrong_shard());
                }
                Some(lists)
            }
            _ if self.part.is_some() => return Err(wrong_shard()),
            _ => None,
        };
        let assigned = match lists {
            Some(_) => Some(self.lists.as_deref().ok_or(SearchError::NoLists)?),
            None => None,
        };
        let k = query.k as usize;
        // A max-heap of the k nearest so far: its top is the one to drop next.
        let mut nearest: BinaryHeap<Candidate> = BinaryHeap::with_capacity(k + 1);
        let mut scanned = 0u64;
        for (row, (&id, vector)) in self
            .ids
            .iter()
            .zip(self.data.chunks_exact(self.dim))
            .enumerate()
        {
            let selected = match (lists, assigned) {
                (Some(wanted), Some(assigned)) => wanted.contains(&assigned[row]),
                _ => query.filter.selects_id(id),
            };
            if !selected {
                continue;
            }
            scanned += 1;
            let candidate = Candidate {
                distance: query.metric.distance(&query.vector, vector),
                id,
            };
            if nearest.len() < k {
                nearest.push(candidate);
            } else if nearest.peek().is_some_and(|worst| candidate < *worst) {
                nearest.pop();
                nearest.push(candidate);
            }
        }
        let hits = nearest
            .into_sorted_vec()
            .into_iter()
            .map(|c| Hit {
                id: c.id,
                distance: c.distance,
            })
            .collect();
        Ok(ShardAnswer { hits, scanned })
    }
}

/// A hit ordered by (distance, id).
#[derive(Clone, Copy, Debug)]
struct Candidate {
    distance: f32,
    id: u64,
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Candidate {}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.distance
            .total_cmp(&other.distance)
            .then(self.id.cmp(&other.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::Metric;

    fn line(n: usize) -> Vectors {
        Vectors {
            dim: 1,
            data: (0..n).map(|i| i as f32).collect(),
        }
    }

    fn query(at: f32, k: u32, filter: ShardFilter) -> ShardQuery {
        ShardQuery {
            vector: vec![at],
            k,
            metric: Metric::L2,
            filter,
            child: 0,
        }
    }

    fn ids(answer: &ShardAnswer) -> Vec<u64> {
        answer.hits.iter().map(|h| h.id).collect()
    }

    #[test]
    fn shards_hold_contiguous_rows_and_search_only_their_own() {
        let part = ShardPart::parse("1/3").unwrap();
        assert_eq!(part.rows(10), 3..6);
        let shard = ShardIndex::from_rows(&line(10), Some(part));
        let answer = shard.search(&query(0.0, 2, ShardFilter::Shard(1))).unwrap();
        assert_eq!(ids(&answer), [3, 4]);
        assert!(shard.search(&query(0.0, 2, ShardFilter::Shard(0))).is_err());
        assert!(
            shard
                .search(&query(0.0, 2, ShardFilter::IdRange(0, 5)))
                .is_err()
        );
        assert!(ShardPart::parse("3/3").is_err());
        assert!(ShardPart::parse("x").is_err());
    }

    #[test]
    fn filters_select_ties_go_by_id_and_dimensions_are_checked() {
        let whole = ShardIndex::from_rows(&line(10), None);
        let ranged = whole
            .search(&query(9.0, 3, ShardFilter::IdRange(2, 6)))
            .unwrap();
        assert_eq!(ids(&ranged), [5, 4, 3]);
        assert_eq!(ranged.scanned, 4);
        // 4 and 6 are both 1 away from 5: the lower id first.
        let tie = whole
            .search(&query(5.0, 3, ShardFilter::IdRange(0, 10)))
            .unwrap();
        assert_eq!(ids(&tie), [5, 4, 6]);
        let mut wide = query(1.0, 1, ShardFilter::IdRange(0, 10));
        wide.vector = vec![1.0, 2.0];
        assert!(matches!(
            whole.search(&wide),
            Err(SearchError::Dimensions { .. })
        ));
        assert_eq!(
            whole.search(&query(0.0, 1, ShardFilter::Centroids(vec![0]))),
            Err(SearchError::NoLists)
        );
    }
}
