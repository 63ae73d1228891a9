//! The instances of one policy version kept for reuse. A caller borrows one in place under
//! that instance's own lock, so a decision costs one uncontended lock rather than a pop and a
//! push under a shared one; each thread starts at its own slot, so threads rarely meet.

use super::runtime::PolicyError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// Instances kept per version; a caller that finds every one busy runs on a one-off instance.
pub const POOLED_INSTANCES: usize = 8;

static NEXT_HOME_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The slot this thread tries first, in every pool.
    static HOME_SLOT: usize = NEXT_HOME_SLOT.fetch_add(1, Ordering::Relaxed);
}

pub struct InstancePool<P> {
    slots: Box<[Mutex<Option<P>>]>,
}

impl<P> InstancePool<P> {
    /// A pool holding `first` (the instance that proved the version loads).
    pub fn new(first: P) -> InstancePool<P> {
        let slots: Box<[Mutex<Option<P>>]> =
            (0..POOLED_INSTANCES).map(|_| Mutex::new(None)).collect();
        let home = HOME_SLOT.with(|home| *home) % POOLED_INSTANCES;
        if let Ok(mut slot) = slots[home].lock() {
            *slot = Some(first);
        }
        InstancePool { slots }
    }

    /// Runs `call` on a pooled instance, made by `make` where its slot is empty. An instance
    /// whose call failed is dropped, so a store that faulted is never reused.
    pub fn with<R>(
        &self,
        make: impl FnOnce() -> Result<P, PolicyError>,
        call: impl FnOnce(&mut P) -> Result<R, PolicyError>,
    ) -> Result<R, PolicyError> {
        let home = HOME_SLOT.with(|home| *home);
        for step in 0..POOLED_INSTANCES {
            let Some(mut slot) = self.try_slot((home + step) % POOLED_INSTANCES) else {
                continue;
            };
            let instance = match slot.as_mut() {
                Some(instance) => instance,
                None => slot.insert(make()?),
            };
            let answer = call(instance);
            if answer.is_err() {
                *slot = None;
            }
            return answer;
        }
        call(&mut make()?)
    }

    /// How many slots hold an instance now.
    #[cfg(test)]
    pub fn pooled(&self) -> usize {
        (0..POOLED_INSTANCES)
            .filter_map(|index| self.try_slot(index))
            .filter(|slot| slot.is_some())
            .count()
    }

    /// The slot's lock if it is free. A slot poisoned by a panic in a call is emptied, since
    /// its instance may be half-way through a call.
    fn try_slot(&self, index: usize) -> Option<MutexGuard<'_, Option<P>>> {
        match self.slots[index].try_lock() {
            Ok(slot) => Some(slot),
            Err(TryLockError::Poisoned(poisoned)) => {
                let mut slot = poisoned.into_inner();
                *slot = None;
                self.slots[index].clear_poison();
                Some(slot)
            }
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_slot_is_reused_and_a_failed_instance_is_dropped() {
        let pool = InstancePool::new(1u32);
        let mut made = 0;
        let answer = pool.with(
            || {
                made += 1;
                Ok(100)
            },
            |instance| Ok(*instance),
        );
        assert_eq!(answer.unwrap(), 1, "the first instance is used");
        assert_eq!(made, 0);

        let failed: Result<(), _> = pool.with(|| Ok(7), |_| Err(PolicyError::Fault("trap".into())));
        assert!(failed.is_err());
        assert_eq!(pool.pooled(), 0, "the faulted instance is gone");

        let answer = pool.with(|| Ok(7), |instance| Ok(*instance));
        assert_eq!(answer.unwrap(), 7, "its slot is refilled by a new one");
        assert_eq!(pool.pooled(), 1);
    }

    #[test]
    fn callers_that_find_every_slot_busy_each_get_an_instance() {
        let pool = InstancePool::new(0usize);
        let made = AtomicUsize::new(0);
        let in_call = std::sync::Barrier::new(POOLED_INSTANCES + 2);
        std::thread::scope(|scope| {
            for _ in 0..POOLED_INSTANCES + 2 {
                scope.spawn(|| {
                    pool.with(
                        || Ok(made.fetch_add(1, Ordering::SeqCst) + 1),
                        |_| {
                            // Every caller is inside a call at once: none can share.
                            in_call.wait();
                            Ok(())
                        },
                    )
                    .unwrap();
                });
            }
        });
        assert_eq!(
            made.load(Ordering::SeqCst),
            POOLED_INSTANCES + 1,
            "one per caller beyond the first, which had the pooled one"
        );
        assert_eq!(
            pool.pooled(),
            POOLED_INSTANCES,
            "the one-off instance is not kept"
        );
    }
}
