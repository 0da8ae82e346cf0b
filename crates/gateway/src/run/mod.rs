//! Runs: the thread registry with one async lock per thread (D-20), admission, and the per-run
//! drivers that talk to the kernel and emit AG-UI events.

pub mod admission;
pub mod cancel;
mod driver;
pub mod kernel;
mod request;
pub mod sink;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::config::Config;
use crate::store::{StoreError, ThreadDoc, ThreadStore};

pub use driver::spawn_run;
pub use kernel::Kernel;

/// Time source (injected so expiry can be tested without sleeping).
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

/// Environment lookup shared by the runtime (snapshot of the process environment at start-up).
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Controls of an active run, shared with the cancellation extension.
#[derive(Default)]
pub struct RunControl {
    /// Set by the cancellation extension: stop, and cancel the task as soon as its id is known.
    pub cancel_requested: AtomicBool,
    pub notify: Notify,
}

impl RunControl {
    pub fn request_cancel(&self) {
        self.cancel_requested.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
    pub fn is_cancel_requested(&self) -> bool {
        self.cancel_requested.load(Ordering::SeqCst)
    }
}

/// The active (non-guidance) run of a thread.
pub struct ActiveRun {
    pub run_id: String,
    pub execution_id: String,
    pub control: Arc<RunControl>,
}

/// In-memory state of one thread, behind its own async lock.
#[derive(Default)]
pub struct SlotState {
    pub loaded: bool,
    /// `None`: no binding yet.
    pub doc: Option<ThreadDoc>,
    pub active: Option<ActiveRun>,
}

#[derive(Default)]
pub struct Slot {
    pub state: tokio::sync::Mutex<SlotState>,
}

impl Slot {
    /// Locked, running, or waiting for interrupt responses.
    fn in_use(&self) -> bool {
        match self.state.try_lock() {
            Ok(st) => {
                st.active.is_some()
                    || st
                        .doc
                        .as_ref()
                        .is_some_and(|d| !d.execution.pending.is_empty())
            }
            Err(_) => true,
        }
    }
}

/// Thread registry: a short std mutex for lookup/creation, never held across `.await`.
pub struct Threads {
    pub store: Arc<dyn ThreadStore>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Soft cap of idle threads kept in memory.
    cap: usize,
}

impl Threads {
    pub fn new(store: Arc<dyn ThreadStore>) -> Threads {
        Threads {
            store,
            slots: Mutex::new(HashMap::new()),
            cap: 10_000,
        }
    }

    /// The slot of a thread (created empty when unknown).
    pub fn slot(&self, thread_id: &str) -> Arc<Slot> {
        let mut map = self.slots.lock().expect("threads lock");
        if map.len() >= self.cap && !map.contains_key(thread_id) {
            Self::evict_idle(&mut map);
        }
        map.entry(thread_id.to_owned())
            .or_insert_with(|| Arc::new(Slot::default()))
            .clone()
    }

    /// Existing slot only.
    pub fn existing(&self, thread_id: &str) -> Option<Arc<Slot>> {
        self.slots
            .lock()
            .expect("threads lock")
            .get(thread_id)
            .cloned()
    }

    /// Drops idle threads from memory (their state is on disk): not referenced elsewhere, not
    /// locked, no active run, no pending interrupt.
    fn evict_idle(map: &mut HashMap<String, Arc<Slot>>) {
        map.retain(|_, slot| Arc::strong_count(slot) > 1 || slot.in_use());
    }

    /// Number of threads in memory.
    pub fn len(&self) -> usize {
        self.slots.lock().expect("threads lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when any loaded thread has an active run or a pending interrupt (idle shutdown, §1.6).
    pub fn busy(&self) -> bool {
        let slots: Vec<Arc<Slot>> = self
            .slots
            .lock()
            .expect("threads lock")
            .values()
            .cloned()
            .collect();
        slots.iter().any(|s| s.in_use())
    }

    /// Loads the thread into `st` if needed (blocking pool). A failed load leaves it unloaded.
    pub async fn ensure_loaded(
        &self,
        st: &mut SlotState,
        thread_id: &str,
    ) -> Result<(), StoreError> {
        if st.loaded {
            return Ok(());
        }
        let store = self.store.clone();
        let id = thread_id.to_owned();
        let doc = tokio::task::spawn_blocking(move || store.load(&id))
            .await
            .map_err(|e| StoreError::Io(std::io::Error::other(e.to_string())))??;
        st.doc = doc;
        st.loaded = true;
        Ok(())
    }

    /// Persists a document: through the store's queued path when it has one (no blocking thread
    /// waits for the sync), else on the blocking pool.
    pub async fn persist(&self, doc: &ThreadDoc) -> Result<(), StoreError> {
        if let Some(saving) = self.store.save_queued(doc) {
            return saving.await;
        }
        let store = self.store.clone();
        let doc = doc.clone();
        tokio::task::spawn_blocking(move || store.save(&doc))
            .await
            .map_err(|e| StoreError::Io(std::io::Error::other(e.to_string())))?
    }
}

/// Last-activity bookkeeping for idle shutdown.
#[derive(Default)]
pub struct Activity {
    pub last_ms: AtomicI64,
    pub open_streams: AtomicUsize,
}

/// Everything a run needs, shared by the HTTP handlers.
pub struct Runtime {
    pub cfg: Arc<Config>,
    pub threads: Threads,
    pub kernel: Arc<Kernel>,
    pub clock: Arc<dyn Clock>,
    pub env: Env,
    pub activity: Activity,
    /// Set when the gateway drains for shutdown: no new admissions.
    pub draining: AtomicBool,
    /// Notified when draining starts (open streams end with a terminal event).
    pub drain: Notify,
    /// Bounded channel capacity per run (events buffered towards a slow client).
    pub channel_capacity: usize,
}

impl Runtime {
    pub fn touch(&self) {
        self.activity
            .last_ms
            .store(self.clock.now_ms(), Ordering::SeqCst);
    }
}

/// `agui-` + first 40 hex chars of SHA-256(threadId).
pub fn context_id(thread_id: &str) -> String {
    let h = crate::canonical::sha256_hex(thread_id.as_bytes());
    format!("agui-{}", &h[..40])
}

#[cfg(test)]
mod tests {
    #[test]
    fn context_id_formula() {
        assert_eq!(
            super::context_id("thread-1"),
            "agui-4b0a5fefc328e6b9257bc535e3c5d26fec36b52f"
        );
        assert_eq!(
            super::context_id("t1"),
            "agui-628b49d96dcde97a430dd4f597705899e09a968f"
        );
    }
}
