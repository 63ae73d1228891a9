//! The signal that tasks joined a queue or a lease ended (its worker has room again), and
//! when: claims that long-poll wait on it, and learn from it when the work or the room they were
//! woken for appeared, so a claim's latency can be told apart from its wait for work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Signals remembered with their time. A waiter looks up the signal after the one it saw
/// before parking, within microseconds to milliseconds of being woken; 64 signals later the
/// time is gone, and the waiter counts from its wake-up instead.
const REMEMBERED_SIGNALS: u64 = 64;

pub struct WorkSignal {
    notify: Notify,
    /// Signals sent so far. Only one thread sends: the flusher, once a group is durable.
    sent: AtomicU64,
    /// The time of signal `n`, in µs since `epoch`, at `n % REMEMBERED_SIGNALS`.
    sent_at_us: [AtomicU64; REMEMBERED_SIGNALS as usize],
    epoch: Instant,
}

impl Default for WorkSignal {
    fn default() -> Self {
        WorkSignal {
            notify: Notify::new(),
            sent: AtomicU64::new(0),
            sent_at_us: std::array::from_fn(|_| AtomicU64::new(0)),
            epoch: Instant::now(),
        }
    }
}

impl WorkSignal {
    /// Wakes every waiter: tasks joined a queue, or a lease ended. Called by one thread alone.
    pub fn send(&self) {
        let n = self.sent.load(Ordering::Relaxed) + 1;
        let at_us = self.epoch.elapsed().as_micros() as u64;
        self.sent_at_us[(n % REMEMBERED_SIGNALS) as usize].store(at_us, Ordering::Relaxed);
        // Release: a waiter that sees `n` also sees its time.
        self.sent.store(n, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// How many signals were sent so far; read it before arming a wait, then
    /// `sent_after(seen)` tells when the next one came.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// A future that resolves at the next signal once enabled (see `Notify::notified`).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// When the first signal after `seen` was sent, if it was and is still remembered. A
    /// waiter that reads this while a 64th later signal is being sent may get that one's time;
    /// waiters look within milliseconds, and signals come at most once per writer group.
    pub fn sent_after(&self, seen: u64) -> Option<Instant> {
        let n = seen + 1;
        let sent = self.sent();
        if sent < n || sent - n >= REMEMBERED_SIGNALS {
            return None;
        }
        let at_us = self.sent_at_us[(n % REMEMBERED_SIGNALS) as usize].load(Ordering::Relaxed);
        Some(self.epoch + Duration::from_micros(at_us))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_learns_when_the_signal_after_the_one_it_saw_was_sent() {
        let signal = WorkSignal::default();
        let seen = signal.sent();
        assert_eq!(signal.sent_after(seen), None, "nothing sent yet");
        let before = Instant::now();
        signal.send();
        let after = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        signal.send();
        let first = signal
            .sent_after(seen)
            .expect("the first signal is remembered");
        // The stored time is truncated to µs, so allow for it below `before`.
        assert!(first + Duration::from_micros(1) >= before && first <= after);
        let second = signal.sent_after(seen + 1).expect("so is the second");
        assert!(second >= first + Duration::from_millis(2));
    }

    #[test]
    fn a_signal_too_far_back_is_forgotten() {
        let signal = WorkSignal::default();
        for _ in 0..REMEMBERED_SIGNALS {
            signal.send();
        }
        assert!(signal.sent_after(0).is_some(), "64 back is still kept");
        signal.send();
        assert_eq!(signal.sent_after(0), None, "65 back is not");
        assert!(signal.sent_after(1).is_some());
    }

    #[tokio::test]
    async fn a_send_wakes_an_enabled_waiter() {
        let signal = std::sync::Arc::new(WorkSignal::default());
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let sender = signal.clone();
        std::thread::spawn(move || sender.send());
        tokio::time::timeout(Duration::from_secs(10), notified)
            .await
            .expect("the waiter is woken");
        assert_eq!(signal.sent(), 1);
    }
}
