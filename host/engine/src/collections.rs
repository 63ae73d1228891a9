//! The vector collections the engine knows: those an admin declared (kept in the catalog by
//! whoever declared them; the engine holds the set in force) and those its shard workers
//! announce in heartbeats. A worker whose announcement disagrees with a collection's shape is
//! refused; a split is given the collection's layout — its shards, and which have a live
//! worker — taken from the same table.

use super::Engine;
use serde::Serialize;
use sluice_model::{Collection, Layout, Metric, ShardAnnouncement};
use std::collections::{BTreeMap, BTreeSet};

/// Why a heartbeat was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatRefused {
    #[error("the scheduler knows {max} workers already; no more are taken")]
    TooManyWorkers { max: usize },
    /// The worker's vectors do not fit the collection it names.
    #[error("{0}")]
    CollectionMismatch(String),
}

/// One shard of a collection as `GET /v1/collections` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ShardView {
    pub shard: u32,
    /// Workers with a fresh heartbeat holding it.
    pub workers: Vec<String>,
    /// Vectors it holds, as its first live worker says.
    pub vectors: u64,
}

/// A collection, its shape and which of its shards have a live worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CollectionView {
    pub name: String,
    pub dim: u32,
    pub metric: Metric,
    pub shards: u32,
    /// Whether an admin declared it; otherwise it is known from its workers alone.
    pub declared: bool,
    /// Shards with a live worker, of `shards`.
    pub live_shards: u32,
    /// Every shard, live or not.
    pub layout: Vec<ShardView>,
}

/// Declared collections by name.
#[derive(Debug, Default)]
pub(crate) struct Declared(BTreeMap<String, Collection>);

impl Declared {
    pub(crate) fn new(collections: &[Collection]) -> Declared {
        Declared(
            collections
                .iter()
                .map(|c| (c.name.clone(), c.clone()))
                .collect(),
        )
    }
}

impl Engine {
    /// The declared collections from now on (the whole set). Workers already announcing a
    /// shard that disagrees keep their place until their next heartbeat, which is refused.
    pub fn set_collections(&mut self, collections: Vec<Collection>) {
        self.collections = Declared::new(&collections);
    }

    /// Why `worker`'s announcement cannot join its collection, if it cannot: against the
    /// declaration, or else against another live worker's announcement.
    pub(crate) fn announcement_refused(
        &self,
        now_ms: u64,
        worker: &str,
        announced: &ShardAnnouncement,
    ) -> Option<String> {
        if let Some(declared) = self.collections.0.get(&announced.collection) {
            return announced.disagreement(declared.dim, declared.shards, "as declared");
        }
        let (other, theirs) = self
            .announcements(now_ms, &announced.collection)
            .find(|(id, _)| *id != worker)?;
        let by = format!("as worker {other} holds it");
        announced.disagreement(theirs.dim, theirs.shards, &by)
    }

    /// Live workers' announcements of `collection`, by worker id.
    fn announcements<'a>(
        &'a self,
        now_ms: u64,
        collection: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a ShardAnnouncement)> + 'a {
        let stale_after_ms = self.options.worker_stale_ms;
        self.workers.iter().filter_map(move |(id, state)| {
            let announced = state.heartbeat.vectors.as_ref()?;
            (announced.collection == collection && state.is_fresh(now_ms, stale_after_ms))
                .then_some((id.as_str(), announced))
        })
    }

    /// `collection`'s layout now: declared, or as its live workers announce it; `None` when
    /// neither knows it.
    pub fn layout(&self, now_ms: u64, collection: &str) -> Option<Layout> {
        let declared = self.collections.0.get(collection);
        let mut live = BTreeSet::new();
        let mut shape = declared.map(|c| (c.dim, c.shards, c.metric));
        for (_, announced) in self.announcements(now_ms, collection) {
            let (dim, shards, _) =
                *shape.get_or_insert((announced.dim, announced.shards, Metric::L2));
            // Announcements that disagree were refused; one left from before a declaration
            // changed is not counted.
            if announced.dim == dim && announced.shards == shards {
                live.insert(announced.shard);
            }
        }
        let (dim, shards, metric) = shape?;
        debug_assert!(
            live.iter().all(|&s| s < shards),
            "a live shard is in the layout"
        );
        Some(Layout {
            collection: collection.to_owned(),
            dim,
            metric,
            shards,
            live: live.into_iter().collect(),
            declared: declared.is_some(),
        })
    }

    /// Every collection known, declared or announced, by name.
    pub fn collections(&self, now_ms: u64) -> Vec<CollectionView> {
        let mut names: BTreeSet<&str> = self.collections.0.keys().map(String::as_str).collect();
        let stale_after_ms = self.options.worker_stale_ms;
        for (_, state) in self.workers.iter() {
            if let Some(announced) = &state.heartbeat.vectors
                && state.is_fresh(now_ms, stale_after_ms)
            {
                names.insert(&announced.collection);
            }
        }
        names
            .into_iter()
            .filter_map(|name| self.collection_view(now_ms, name))
            .collect()
    }

    pub fn collection_view(&self, now_ms: u64, name: &str) -> Option<CollectionView> {
        let layout = self.layout(now_ms, name)?;
        let mut shards: Vec<ShardView> = (0..layout.shards)
            .map(|shard| ShardView {
                shard,
                workers: Vec::new(),
                vectors: 0,
            })
            .collect();
        for (worker, announced) in self.announcements(now_ms, name) {
            if announced.dim != layout.dim || announced.shards != layout.shards {
                continue;
            }
            if let Some(view) = shards.get_mut(announced.shard as usize) {
                if view.workers.is_empty() {
                    view.vectors = announced.vectors;
                }
                view.workers.push(worker.to_owned());
            }
        }
        Some(CollectionView {
            name: layout.collection,
            dim: layout.dim,
            metric: layout.metric,
            shards: layout.shards,
            declared: layout.declared,
            live_shards: layout.live.len() as u32,
            layout: shards,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Engine, EngineOptions};
    use sluice_model::Heartbeat;

    fn shard_worker(shard: u32, shards: u32, dim: u32) -> Heartbeat {
        Heartbeat {
            vectors: Some(ShardAnnouncement {
                collection: "docs".into(),
                shard,
                shards,
                dim,
                vectors: 100,
            }),
            ..Heartbeat::default()
        }
    }

    #[test]
    fn announcements_make_the_layout_and_a_disagreeing_worker_is_refused() {
        let mut engine = Engine::new(EngineOptions {
            worker_stale_ms: 1_000,
            ..EngineOptions::default()
        });
        assert_eq!(engine.layout(0, "docs"), None);
        engine.heartbeat(0, "w0", shard_worker(0, 4, 8)).unwrap();
        engine.heartbeat(0, "w3", shard_worker(3, 4, 8)).unwrap();
        let layout = engine.layout(0, "docs").unwrap();
        assert_eq!((layout.shards, layout.dim, layout.declared), (4, 8, false));
        assert_eq!(layout.live, [0, 3]);
        // Another shard count, or another dimension, than the live workers hold.
        for (worker, heartbeat, says) in [
            ("w5", shard_worker(5, 8, 8), "as worker w0 holds it"),
            ("w1", shard_worker(1, 4, 16), "16 dimensions"),
        ] {
            let refused = engine.heartbeat(0, worker, heartbeat).unwrap_err();
            assert!(refused.to_string().contains(says), "{refused}");
            assert!(
                engine.worker(0, worker).is_none(),
                "a refused worker is not taken"
            );
        }
        // A worker whose heartbeat is stale no longer counts as live.
        engine.heartbeat(900, "w0", shard_worker(0, 4, 8)).unwrap();
        assert_eq!(engine.layout(1_500, "docs").unwrap().live, [0]);
        // Once every announcing worker is stale, the collection is unknown (none declared).
        assert_eq!(engine.layout(5_000, "docs"), None);
    }

    #[test]
    fn a_declaration_holds_workers_to_its_shape_and_is_known_without_them() {
        let mut engine = Engine::default();
        engine.set_collections(vec![Collection {
            name: "docs".into(),
            dim: 8,
            metric: Metric::Ip,
            shards: 2,
        }]);
        let layout = engine.layout(0, "docs").unwrap();
        assert_eq!(
            (
                layout.shards,
                layout.metric,
                layout.declared,
                layout.live.len()
            ),
            (2, Metric::Ip, true, 0)
        );
        let refused = engine.heartbeat(0, "w", shard_worker(0, 4, 8)).unwrap_err();
        assert!(
            matches!(&refused, HeartbeatRefused::CollectionMismatch(why) if why.contains("as declared")),
            "{refused}"
        );
        engine.heartbeat(0, "w", shard_worker(1, 2, 8)).unwrap();
        let view = engine.collection_view(0, "docs").unwrap();
        assert_eq!(view.live_shards, 1);
        assert_eq!(view.layout[1].workers, ["w"]);
        assert!(view.layout[0].workers.is_empty());
        assert_eq!(engine.collections(0).len(), 1);
    }
}
