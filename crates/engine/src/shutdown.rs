//! Stopping: the drain signal every run watches, and the activity bookkeeping idle shutdown
//! reads.
//!
//! On SIGTERM, SIGINT or idle shutdown the gateway drains: no new run is admitted, every open
//! stream ends with a terminal event (its kernel task cancelled), and the process exits once they
//! are written or the shutdown timeout passes.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

use tokio_util::sync::CancellationToken;

/// The drain signal. Set once, never cleared.
#[derive(Debug, Default)]
pub struct Shutdown(CancellationToken);

impl Shutdown {
    /// Starts draining; every waiter wakes.
    pub fn begin(&self) {
        self.0.cancel();
    }

    pub fn is_draining(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once draining has begun (at once when it has).
    pub async fn drained(&self) {
        self.0.cancelled().await
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
