//! Stopping: the drain signal every run watches, and the activity bookkeeping idle shutdown
//! reads.
//!
//! On SIGTERM, SIGINT or idle shutdown the gateway drains: no new run is admitted, every open
//! stream ends with a terminal event (its kernel task cancelled), and the process exits once they
//! are written or the shutdown timeout passes.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The drain signal. Set once, never cleared.
#[derive(Debug, Default)]
pub struct Shutdown {
    draining: AtomicBool,
    begun: Notify,
}

impl Shutdown {
    /// Starts draining; every waiter wakes.
    pub fn begin(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.begun.notify_waiters();
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Resolves once draining has begun. A waiter is registered when the future is first
    /// polled, so a loop can arm it once for many events.
    pub async fn drained(&self) {
        let notified = self.begun.notified();
        if self.is_draining() {
            return;
        }
        notified.await;
    }
}

/// What idle shutdown looks at: open event streams and the last moment anything happened.
#[derive(Debug, Default)]
pub struct Activity {
    last_ms: AtomicI64,
    open_streams: AtomicUsize,
}

impl Activity {
    /// Something happened at `now_ms`.
    pub fn touch(&self, now_ms: i64) {
        self.last_ms.store(now_ms, Ordering::SeqCst);
    }

    pub fn stream_opened(&self) {
        self.open_streams.fetch_add(1, Ordering::SeqCst);
    }

    pub fn stream_closed(&self, now_ms: i64) {
        self.open_streams.fetch_sub(1, Ordering::SeqCst);
        self.touch(now_ms);
    }

    pub fn open_streams(&self) -> usize {
        self.open_streams.load(Ordering::SeqCst)
    }

    /// Milliseconds since the last activity.
    pub fn idle_ms(&self, now_ms: i64) -> i64 {
        now_ms - self.last_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_armed_before_the_signal_wakes_and_a_late_one_returns_at_once() {
        let s = std::sync::Arc::new(Shutdown::default());
        let early = tokio::spawn({
            let s = s.clone();
            async move { s.drained().await }
        });
        tokio::task::yield_now().await;
        assert!(!s.is_draining());
        s.begin();
        tokio::time::timeout(std::time::Duration::from_secs(5), early)
            .await
            .expect("woken")
            .unwrap();
        s.drained().await;
    }
}
