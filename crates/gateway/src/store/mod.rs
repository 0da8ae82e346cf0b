//! Durable thread state (§16, D-2, D-18, D-19).
//!
//! One small JSON document per thread (schemaVersion 1), interchangeable with the reference
//! adapter's files in both directions. The [`ThreadStore`] trait is synchronous: callers run it on
//! the blocking pool.

mod doc;
mod file;
mod journal;

pub use doc::{
    project_input as doc_project_input, AppliedDigest, Execution, PendingEntry, ThreadDoc,
    PENDING_ALLOW_LIST,
};
pub use file::{file_stem, FileStore};

use std::sync::atomic::{AtomicU32, Ordering};

/// A boxed future of a store operation.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
use std::sync::Arc;

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file exists but is not a valid document for this thread (corrupt, truncated, symlinked,
    /// foreign thread, not a regular file…).
    #[error("thread state is invalid: {0}")]
    Invalid(String),
    #[error("thread state I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Where thread documents live.
pub trait ThreadStore: Send + Sync + 'static {
    /// Loads a thread; `Ok(None)` when it does not exist.
    fn load(&self, thread_id: &str) -> Result<Option<ThreadDoc>, StoreError>;
    /// Atomically replaces the thread's document.
    fn save(&self, doc: &ThreadDoc) -> Result<(), StoreError>;
    /// A save awaited without holding a blocking thread while it becomes durable (the journal's
    /// group commit). `None`: this store has no such path; use [`ThreadStore::save`] on the
    /// blocking pool.
    fn save_queued(&self, _doc: &ThreadDoc) -> Option<BoxFuture<'static, Result<(), StoreError>>> {
        None
    }
    /// Whether [`ThreadStore::save_queued`] is available at all.
    fn queues(&self) -> bool {
        false
    }
    /// Makes every completed save durable in its final place (clean shutdown).
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// The store of a state directory that could not be opened: every load and save fails with the
/// reason (clear 503s instead of a crash).
pub struct Unavailable(pub String);

impl ThreadStore for Unavailable {
    fn load(&self, _: &str) -> Result<Option<ThreadDoc>, StoreError> {
        Err(StoreError::Io(std::io::Error::other(self.0.clone())))
    }
    fn save(&self, _: &ThreadDoc) -> Result<(), StoreError> {
        Err(StoreError::Io(std::io::Error::other(self.0.clone())))
    }
}

/// A store wrapper that fails saves on demand (fault injection for tests of fail-closed paths).
pub struct FaultyStore<S> {
    inner: S,
    fail_saves: Arc<AtomicU32>,
    skip_saves: Arc<AtomicU32>,
}

/// Handle that arms a [`FaultyStore`].
#[derive(Clone, Default)]
pub struct FaultSwitch {
    fail_saves: Arc<AtomicU32>,
    skip_saves: Arc<AtomicU32>,
}

impl FaultSwitch {
    /// The next `n` saves fail, after letting `skip` saves succeed.
    pub fn fail_saves(&self, skip: u32, n: u32) {
        self.skip_saves.store(skip, Ordering::SeqCst);
        self.fail_saves.store(n, Ordering::SeqCst);
    }
}

impl<S: ThreadStore> FaultyStore<S> {
    pub fn new(inner: S) -> (FaultyStore<S>, FaultSwitch) {
        let sw = FaultSwitch::default();
        (
            FaultyStore {
                inner,
                fail_saves: sw.fail_saves.clone(),
                skip_saves: sw.skip_saves.clone(),
            },
            sw,
        )
    }
}

impl<S: ThreadStore> FaultyStore<S> {
    /// The failure to inject into this save, if one is armed.
    fn injected(&self) -> Option<StoreError> {
        if self.fail_saves.load(Ordering::SeqCst) > 0 {
            let skipped = self
                .skip_saves
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| s.checked_sub(1))
                .is_ok();
            if !skipped {
                self.fail_saves.fetch_sub(1, Ordering::SeqCst);
                return Some(StoreError::Io(std::io::Error::other(
                    "injected save failure",
                )));
            }
        }
        None
    }
}

impl<S: ThreadStore> ThreadStore for FaultyStore<S> {
    fn load(&self, thread_id: &str) -> Result<Option<ThreadDoc>, StoreError> {
        self.inner.load(thread_id)
    }
    fn save(&self, doc: &ThreadDoc) -> Result<(), StoreError> {
        if let Some(e) = self.injected() {
            return Err(e);
        }
        self.inner.save(doc)
    }
    fn save_queued(&self, doc: &ThreadDoc) -> Option<BoxFuture<'static, Result<(), StoreError>>> {
        // Without a queued path below, `save` runs and injects (once per save).
        if !self.inner.queues() {
            return None;
        }
        if let Some(e) = self.injected() {
            return Some(Box::pin(std::future::ready(Err(e))));
        }
        self.inner.save_queued(doc)
    }
    fn queues(&self) -> bool {
        self.inner.queues()
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }
}
