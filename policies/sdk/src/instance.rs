//! The policy value `init` made, kept between calls. Each component instance has its own
//! memory and runs one call at a time, so the lock is never contended; it is there because a
//! `static` must be `Sync`.

/// Holds the policy after `init`; before a successful `init`, calls answer nothing the host
/// can use (which it counts as a fault), rather than running on made-up settings.
pub struct Instance<T> {
    value: spin::Mutex<Option<T>>,
}

impl<T> Instance<T> {
    pub const fn new() -> Self {
        Instance {
            value: spin::Mutex::new(None),
        }
    }

    /// Replaces the policy (a later `init` with new settings replaces the earlier one).
    pub fn set(&self, value: T) {
        *self.value.lock() = Some(value);
    }

    /// Runs `f` on the policy, without copying it; `None` before `init`.
    pub fn with<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        self.value.lock().as_ref().map(f)
    }
}

impl<T> Default for Instance<T> {
    fn default() -> Self {
        Self::new()
    }
}
