//! Exact vector search for shard workers: loading a float32 vector set (.fvecs, .npy), one
//! shard's index of it, the search a `vector.search` child asks for, IVF list assignment, and
//! the seeded data the demo and the recall tests use.

mod executor;
mod file;
mod index;
mod kmeans;
mod synthetic;

pub use executor::VectorExecutor;
pub use file::{VectorFileError, Vectors, read_vectors, write_fvecs, write_npy};
pub use index::{SearchError, ShardIndex, ShardPart};
pub use kmeans::{assign, kmeans, nearest_list};
pub use synthetic::{brute_force, clustered};

#[cfg(test)]
mod recall_tests;
