//! A run's place on a kernel (`Bound`: its count in the kernel's load until dropped), the
//! counters a kernel's load is made of, and why a run found no place: shared by the pool's fixed
//! slots and its users' seats.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use super::Kernel;

/// Milliseconds since the first call: the clock of a seat's idleness.
pub(super) fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// One kernel of a pool, at a scrape of the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotGauges {
    pub up: bool,
    pub restarts: u64,
    /// Runs bound to it.
    pub active: u64,
}

/// A slot's counters.
#[derive(Debug, Default)]
pub(super) struct Load {
    /// Runs bound to it now.
    pub(super) active: AtomicUsize,
    /// Threads placed on it so far.
    pub(super) placed: AtomicU64,
    /// When a run last ended on it (or its kernel started), in [`now_ms`]: a
    /// tenant's kernel is idle from then.
    pub(super) touched: AtomicU64,
}

/// A run's place on a slot: its kernel, and its count in the slot's load until dropped.
#[derive(Debug)]
pub struct Bound {
    pub kernel: Arc<Kernel>,
    /// The slot's key, when the thread must record it before the kernel is asked anything.
    pub record: Option<String>,
    /// The thread comes from another kernel: its session is restored first.
    pub moved: bool,
    lease: Arc<Load>,
}

impl Bound {
    pub(super) fn new(
        kernel: Arc<Kernel>,
        record: Option<String>,
        moved: bool,
        lease: Arc<Load>,
    ) -> Bound {
        Bound {
            kernel,
            record,
            moved,
            lease,
        }
    }
}

impl Drop for Bound {
    fn drop(&mut self) {
        self.lease.touched.store(now_ms(), Ordering::Relaxed);
        self.lease.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where a run cannot go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unplaced {
    /// No kernel became ready in time.
    NoneReady,
    /// The thread's kernel is dead and this run may not move it.
    Gone,
    /// Isolation `user`: the user has no kernel, and every kernel has another user's running
    /// turns.
    Busy,
}
