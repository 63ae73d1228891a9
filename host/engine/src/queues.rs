//! Bucket queues: the tasks waiting in each priority bucket in (rank, id) order, each with
//! what a claim needs to match it to a worker and what the aging policy reads of it
//! (`Waiting`, the model's `QueueEntry`); and inside each bucket, one queue per tenant with
//! the stride-scheduling pass that shares a bucket's claims among its tenants by weight.
//!
//! Fair share is stride scheduling: each tenant waiting in a bucket has a pass, and a claim
//! serves the tenant with the lowest pass that has a task the worker can run, then moves its
//! pass on by `STRIDE_SCALE / weight`. A tenant that starts waiting starts at the bucket's
//! virtual time (the pass last served), so it gets its share from its first task on: neither
//! behind a flood that came before it nor ahead with credit saved while it had nothing to run.

pub use sluice_model::QueueEntry as Waiting;
use sluice_model::{Priority, TaskId, TaskIdMap, TaskNames};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// A tenant's pass moves on by this over its weight at each claim: divisible by every weight
/// up to 16 and large enough that rounding is far below a task for any weight allowed.
const STRIDE_SCALE: u64 = 720_720 << 20;

/// Weights by tenant name, as a priority policy names them (a tenant not named weighs 1).
pub type NamedWeights = Vec<(String, u32)>;

/// Fair-share weights by tenant, keyed by the code of the tenant's name (`View::tenant`); a
/// tenant not named weighs 1.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantWeights {
    by_code: HashMap<u32, u32>,
}

impl TenantWeights {
    pub fn from_names(weights: &[(String, u32)]) -> TenantWeights {
        TenantWeights {
            by_code: weights
                .iter()
                .map(|(tenant, weight)| (policy_packed::name_code(tenant), (*weight).max(1)))
                .collect(),
        }
    }

    pub fn weight(&self, tenant: u32) -> u32 {
        self.by_code.get(&tenant).copied().unwrap_or(1)
    }

    fn stride(&self, tenant: u32) -> u64 {
        STRIDE_SCALE / u64::from(self.weight(tenant))
    }
}

/// What one charge changed, so that it can be taken back.
#[derive(Clone, Copy, Debug)]
#[must_use]
pub struct Charged {
    bucket: Priority,
    tenant: u32,
    /// The tenant's pass and the bucket's virtual time before; none when the tenant had no pass.
    before: Option<(u64, u64)>,
}

/// One bucket's tenants: their queues and passes.
#[derive(Debug, Default)]
struct Tenants {
    /// Each waiting tenant's tasks in (rank, id) order.
    queues: HashMap<u32, BTreeSet<(u64, TaskId)>>,
    /// Each waiting tenant's pass. A tenant with nothing waiting has none.
    passes: HashMap<u32, u64>,
    /// The waiting tenants, lowest pass first (ties by code, for determinism).
    order: BTreeSet<(u64, u32)>,
    /// The pass of the tenant served last.
    virtual_time: u64,
}

impl Tenants {
    fn push(&mut self, tenant: u32, rank: u64, id: TaskId) {
        let queue = self.queues.entry(tenant).or_default();
        if queue.is_empty() {
            let pass = self.virtual_time;
            self.passes.insert(tenant, pass);
            self.order.insert((pass, tenant));
        }
        queue.insert((rank, id));
    }

    fn remove(&mut self, tenant: u32, rank: u64, id: TaskId) {
        let Some(queue) = self.queues.get_mut(&tenant) else {
            return;
        };
        queue.remove(&(rank, id));
        if queue.is_empty() {
            self.queues.remove(&tenant);
            if let Some(pass) = self.passes.remove(&tenant) {
                self.order.remove(&(pass, tenant));
            }
        }
    }

    /// Moves `tenant`'s pass on by one claim's stride; answers the pass and virtual time before.
    fn charge(&mut self, tenant: u32, weights: &TenantWeights) -> Option<(u64, u64)> {
        let pass = self.passes.get_mut(&tenant)?;
        let before = (*pass, self.virtual_time);
        self.order.remove(&(*pass, tenant));
        self.virtual_time = self.virtual_time.max(*pass);
        *pass = pass.saturating_add(weights.stride(tenant));
        self.order.insert((*pass, tenant));
        Some(before)
    }

    /// Puts `tenant`'s pass and the virtual time back as they were before a charge.
    fn uncharge(&mut self, tenant: u32, (pass_before, virtual_time_before): (u64, u64)) {
        if let Some(pass) = self.passes.get_mut(&tenant) {
            self.order.remove(&(*pass, tenant));
            *pass = pass_before;
            self.order.insert((pass_before, tenant));
        }
        self.virtual_time = virtual_time_before;
    }
}

/// The entries live in one dense `Vec` with a map from id to place, rather than in the map
/// itself: a hash map sized for a million entries has two million slots, each as large as
/// its value, and the server holds every queued task here (a restart with 1,000,000 queued
/// reserved 438 MB for the map alone; the dense form is about a third of that).
#[derive(Debug, Default)]
pub struct BucketQueues {
    order: [BTreeSet<(u64, TaskId)>; 3],
    tenants: [Tenants; 3],
    /// Every waiting task, in no order: a removal moves the last entry into the hole.
    entries: Vec<Waiting>,
    /// Where each waiting task is in `entries`.
    places: TaskIdMap<u32>,
    names: Interned,
}

/// One shared `TaskNames` per distinct names among the waiting tasks: entries come from the
/// store and the admission step each with their own, and a million waiting tasks of a few
/// hundred devices should hold a few hundred.
#[derive(Debug, Default)]
struct Interned {
    set: HashSet<Arc<TaskNames>>,
    /// How many were held after the last sweep: the next sweep comes when the set doubles.
    after_sweep: usize,
}

/// Below this many held names, no sweep: a sweep costs a pass over them all.
const NAMES_SWEPT_FROM: usize = 1_024;

impl Interned {
    fn share(&mut self, names: &mut Arc<TaskNames>) {
        if let Some(shared) = self.set.get(names) {
            if !Arc::ptr_eq(shared, names) {
                *names = Arc::clone(shared);
            }
            return;
        }
        // Bounded by twice the distinct names still waiting: the set's own reference is the
        // only one left to names no entry holds.
        if self.set.len() >= 2 * self.after_sweep.max(NAMES_SWEPT_FROM) {
            self.set.retain(|held| Arc::strong_count(held) > 1);
            self.after_sweep = self.set.len();
        }
        self.set.insert(Arc::clone(names));
    }
}

impl BucketQueues {
    /// Queues `entries` at once, as at start with a million from the store: the store's own
    /// vector becomes the queues' storage when they are empty, so they are never held twice.
    /// Of two entries for one task the later wins, as with `push`.
    pub fn extend(&mut self, entries: Vec<Waiting>) {
        if !self.entries.is_empty() {
            for entry in entries {
                self.push(entry);
            }
            return;
        }
        self.entries = entries;
        for entry in &mut self.entries {
            self.names.share(&mut entry.names);
        }
        self.places = TaskIdMap::default();
        self.places.reserve(self.entries.len());
        for (place, entry) in self.entries.iter().enumerate() {
            self.places.insert(entry.id, place as u32);
        }
        if self.places.len() < self.entries.len() {
            let places = &self.places;
            let mut place = 0;
            self.entries.retain(|entry| {
                let latest = places.get(&entry.id) == Some(&place);
                place += 1;
                latest
            });
            for (place, entry) in self.entries.iter().enumerate() {
                self.places.insert(entry.id, place as u32);
            }
        }
        for entry in &self.entries {
            let bucket = entry.bucket.index();
            self.order[bucket].insert((entry.rank, entry.id));
            self.tenants[bucket].push(entry.view.tenant, entry.rank, entry.id);
        }
        debug_assert_eq!(self.places.len(), self.entries.len());
    }

    /// Queues `entry`, replacing the same task's entry if it was already waiting.
    pub fn push(&mut self, mut entry: Waiting) {
        self.remove(entry.id);
        self.names.share(&mut entry.names);
        let bucket = entry.bucket.index();
        self.order[bucket].insert((entry.rank, entry.id));
        self.tenants[bucket].push(entry.view.tenant, entry.rank, entry.id);
        // A u32 place bounds the queues at four billion tasks, far past what memory holds.
        self.places.insert(entry.id, self.entries.len() as u32);
        self.entries.push(entry);
    }

    pub fn remove(&mut self, id: TaskId) -> Option<Waiting> {
        let place = self.places.remove(&id)? as usize;
        let entry = self.entries.swap_remove(place);
        if let Some(moved) = self.entries.get(place) {
            self.places.insert(moved.id, place as u32);
        }
        debug_assert_eq!(entry.id, id, "places point at their own entries");
        debug_assert_eq!(self.places.len(), self.entries.len());
        let bucket = entry.bucket.index();
        self.order[bucket].remove(&(entry.rank, entry.id));
        self.tenants[bucket].remove(entry.view.tenant, entry.rank, entry.id);
        Some(entry)
    }

    pub fn get(&self, id: TaskId) -> Option<&Waiting> {
        let place = *self.places.get(&id)?;
        self.entries.get(place as usize)
    }

    pub fn len(&self, bucket: Priority) -> usize {
        self.order[bucket.index()].len()
    }

    pub fn total(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The first task waiting in `bucket`.
    pub fn front(&self, bucket: Priority) -> Option<TaskId> {
        self.order[bucket.index()].first().map(|&(_, id)| id)
    }

    /// The tasks of `bucket`, first in line first.
    pub fn iter(&self, bucket: Priority) -> impl Iterator<Item = &Waiting> {
        self.order[bucket.index()]
            .iter()
            .filter_map(|&(_, id)| self.get(id))
    }

    /// The tasks of `bucket` in the order fair share offers them: tenant by tenant, lowest
    /// pass first, each tenant's tasks first in line first. A claim takes the first that fits.
    pub fn fair_iter(&self, bucket: Priority) -> impl Iterator<Item = &Waiting> {
        let tenants = &self.tenants[bucket.index()];
        tenants
            .order
            .iter()
            .filter_map(|(_, tenant)| tenants.queues.get(tenant))
            .flat_map(|queue| queue.iter())
            .filter_map(|&(_, id)| self.get(id))
    }

    /// A claim served `tenant` in `bucket`: its pass moves on by its stride. The answer takes
    /// it back (`uncharge`), for a claim that ends up leasing nothing.
    pub fn charge(&mut self, bucket: Priority, tenant: u32, weights: &TenantWeights) -> Charged {
        Charged {
            bucket,
            tenant,
            before: self.tenants[bucket.index()].charge(tenant, weights),
        }
    }

    /// Takes back charges, the last first.
    pub fn uncharge(&mut self, charges: Vec<Charged>) {
        for charged in charges.into_iter().rev() {
            if let Some(before) = charged.before {
                self.tenants[charged.bucket.index()].uncharge(charged.tenant, before);
            }
        }
    }

    /// The tenants waiting in `bucket`, with how many tasks each.
    pub fn tenants(&self, bucket: Priority) -> BTreeMap<u32, usize> {
        self.tenants[bucket.index()]
            .queues
            .iter()
            .map(|(&tenant, queue)| (tenant, queue.len()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::{Limits, TaskSpec};

    fn entry(n: u128, tenant: &str) -> Waiting {
        let spec: TaskSpec =
            serde_json::from_value(serde_json::json!({"kind": "k", "tenant": tenant})).unwrap();
        let submission = spec.into_submission(None, &Limits::default()).unwrap();
        let engine = crate::Engine::default();
        let admission = submission.native_admission(n as u64);
        let change = engine.plan_create(1, n, &submission, &admission);
        Waiting::of(&change.writes[0].task)
    }

    /// Serves the bucket `claims` times as a claim would (first offered, then charged).
    fn serve(queues: &mut BucketQueues, weights: &TenantWeights, claims: usize) -> Vec<u32> {
        let mut served = Vec::new();
        for _ in 0..claims {
            let Some(first) = queues.fair_iter(Priority::Normal).next().cloned() else {
                break;
            };
            let _ = queues.charge(Priority::Normal, first.view.tenant, weights);
            queues.remove(first.id);
            served.push(first.view.tenant);
        }
        served
    }

    #[test]
    fn weights_share_the_claims_and_a_newcomer_starts_at_its_share() {
        let (a, b) = (policy_packed::name_code("a"), policy_packed::name_code("b"));
        let mut queues = BucketQueues::default();
        for n in 0..1_000 {
            queues.push(entry(n, "a"));
        }
        let equal = TenantWeights::default();
        assert!(serve(&mut queues, &equal, 100).iter().all(|&t| t == a));
        for n in 1_000..1_200 {
            queues.push(entry(n, "b"));
        }
        // From its first task on, b gets every other claim: not after a's backlog. (It starts
        // a stride behind a, so 21 claims end with the two level.)
        let next = serve(&mut queues, &equal, 21);
        assert_eq!(next[0], b);
        assert_eq!(next.iter().filter(|&&t| t == b).count(), 11, "{next:?}");

        let three_to_one = TenantWeights::from_names(&[("a".into(), 3)]);
        let served = serve(&mut queues, &three_to_one, 360);
        let from_a = served.iter().filter(|&&t| t == a).count();
        assert_eq!((from_a, served.len() - from_a), (270, 90));
        assert_eq!(queues.tenants(Priority::Normal)[&b], 200 - 11 - 90);
    }

    #[test]
    fn a_tenant_that_stops_waiting_keeps_no_credit() {
        let (a, b) = (policy_packed::name_code("a"), policy_packed::name_code("b"));
        let weights = TenantWeights::default();
        let mut queues = BucketQueues::default();
        for n in 0..100 {
            queues.push(entry(n, "a"));
        }
        queues.push(entry(100, "b"));
        assert_eq!(serve(&mut queues, &weights, 2).len(), 2);
        // b emptied its queue after one claim; a was served alone for 50 more.
        assert_eq!(serve(&mut queues, &weights, 50), vec![a; 50]);
        queues.push(entry(200, "b"));
        queues.push(entry(201, "b"));
        // b comes back at the present, not 50 claims ahead: first, then level with a.
        let next = serve(&mut queues, &weights, 3);
        assert_eq!(next[0], b);
        assert_eq!(next.iter().filter(|&&t| t == b).count(), 2, "{next:?}");
        assert!(next.contains(&a));
    }

    /// The dense storage against a plain map, through a start with a duplicate and a run of
    /// pushes and removals in a fixed pseudo-random order.
    #[test]
    fn every_entry_stays_findable_through_extend_push_and_remove() {
        let mut queues = BucketQueues::default();
        let mut expected: BTreeMap<TaskId, u64> = BTreeMap::new();
        let mut start: Vec<Waiting> = (0..50).map(|n| entry(n, "a")).collect();
        let mut again = entry(7, "b");
        again.rank = 1_000;
        start.push(again);
        for waiting in &start {
            expected.insert(waiting.id, waiting.rank);
        }
        queues.extend(start);
        let mut state = 12_345u64;
        for step in 0..2_000u128 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let n = u128::from(state >> 58);
            if state & 1 == 0 {
                let waiting = entry(n, if step % 3 == 0 { "a" } else { "b" });
                expected.insert(waiting.id, waiting.rank);
                queues.push(waiting);
            } else {
                let id = entry(n, "a").id;
                assert_eq!(queues.remove(id).map(|w| w.rank), expected.remove(&id));
            }
            assert_eq!(queues.total(), expected.len());
        }
        for (id, rank) in &expected {
            assert_eq!(queues.get(*id).map(|w| w.rank), Some(*rank));
        }
        let in_order: usize = Priority::ALL
            .into_iter()
            .map(|b| queues.iter(b).count())
            .sum();
        assert_eq!(in_order, expected.len());
    }

    /// Entries of the same names share one; names no entry holds any more are let go, so the
    /// interner stays within twice the names still waiting (plus the sweep's floor).
    #[test]
    fn waiting_entries_share_their_names_and_the_interner_stays_bounded() {
        let mut queues = BucketQueues::default();
        queues.extend((0..10).map(|n| entry(n, "a")).collect());
        for n in 10..20 {
            queues.push(entry(n, "a"));
        }
        let first = Arc::clone(&queues.get(entry(0, "a").id).unwrap().names);
        for n in 1..20 {
            let held = &queues.get(entry(n, "a").id).unwrap().names;
            assert!(Arc::ptr_eq(held, &first), "entry {n} holds its own names");
        }
        // Ten thousand tenants, each waiting once and gone: the interner sweeps them away.
        for n in 100..10_100 {
            let waiting = entry(n, &format!("tenant-{n}"));
            let id = waiting.id;
            queues.push(waiting);
            queues.remove(id);
        }
        assert!(
            queues.names.set.len() <= 2 * NAMES_SWEPT_FROM,
            "{} names held",
            queues.names.set.len()
        );
        assert!(queues.names.set.contains(&first));
    }
}
