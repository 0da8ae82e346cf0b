//! Runs: from a validated request to exactly one terminal AG-UI event.
//!
//! - `decide/`: pure decisions (admission, expiry, resume plans, answers), unit- and
//!   property-tested without a server.
//! - `threads`: the per-thread registry and its durable-first edits.
//! - `admit`: admission's I/O (lock, load, decide, save) before the SSE response starts.
//! - `driver/`: a run's life after admission: the kernel calls, the stream, the events.
//! - `cancel`: the cancellation extension.
//! - `request`: the kernel messages of a run; `sink`: its event channel and SSE body.

pub mod admit;
pub mod cancel;
pub mod decide;
mod driver;
mod request;
pub mod sink;
mod threads;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::config::Config;
use crate::kernel::Kernel;
use crate::shutdown::{Activity, Shutdown};
use crate::store::ThreadStore;

pub use decide::admission::context_id;
pub use driver::spawn_run;
pub use threads::{ActiveRun, Locked, RunControl, Slot, ThreadState, Threads};

/// Time source (injected so expiry can be tested without waiting).
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> i64;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}

/// A clock that can be moved forward (tests).
#[derive(Default)]
pub struct OffsetClock {
    pub offset_ms: AtomicI64,
}

impl Clock for OffsetClock {
    fn now_ms(&self) -> i64 {
        SystemClock.now_ms() + self.offset_ms.load(Ordering::SeqCst)
    }
}

/// Environment lookup (a snapshot of the process environment taken at start-up).
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Everything runs share.
pub struct Runtime {
    cfg: Arc<Config>,
    threads: Threads,
    kernel: Arc<Kernel>,
    clock: Arc<dyn Clock>,
    env: Env,
    activity: Activity,
    shutdown: Shutdown,
    /// Events buffered per run towards a slow client.
    channel_capacity: usize,
}

impl Runtime {
    pub fn new(
        cfg: Config,
        store: Arc<dyn ThreadStore>,
        kernel: Arc<Kernel>,
        clock: Arc<dyn Clock>,
        env: Env,
        channel_capacity: usize,
    ) -> Runtime {
        let rt = Runtime {
            cfg: Arc::new(cfg),
            threads: Threads::new(store),
            kernel,
            clock,
            env,
            activity: Activity::default(),
            shutdown: Shutdown::default(),
            channel_capacity,
        };
        rt.touch();
        rt
    }

    pub fn cfg(&self) -> &Config {
        &self.cfg
    }

    pub fn threads(&self) -> &Threads {
        &self.threads
    }

    pub fn kernel(&self) -> &Arc<Kernel> {
        &self.kernel
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn env(&self) -> &Env {
        &self.env
    }

    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    pub fn channel_capacity(&self) -> usize {
        self.channel_capacity
    }

    /// Records activity now (idle shutdown).
    pub fn touch(&self) {
        self.activity.touch(self.clock.now_ms());
    }

    /// Cancels a kernel task in the background, bounded; nobody waits for the answer.
    pub fn cancel_task_later(&self, task: String) {
        if let Some(client) = self.kernel.client() {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(driver::CANCEL_WAIT, client.cancel_task(&task)).await;
            });
        }
    }
}
