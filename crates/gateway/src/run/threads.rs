//! The thread registry: each thread's document in memory behind its own async lock.
//!
//! One lock per thread serialises that thread's admission, changes and saves; different threads
//! never wait on each other, and no lock is held while a stream is read. The registry's own map
//! sits behind a short std mutex, never held across an `.await`. Idle threads are dropped from
//! memory (their state is on disk) when the map grows past its cap.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::latch::Latch;
use crate::store::{StoreError, ThreadDoc, ThreadStore};

/// Controls of an active run, shared with the cancellation extension.
#[derive(Debug, Default)]
pub struct RunControl {
    cancel: Latch,
}

impl RunControl {
    /// Asks the run to stop and cancel its task (as soon as the kernel names it).
    pub fn request_cancel(&self) {
        self.cancel.set();
    }

    pub fn is_cancel_requested(&self) -> bool {
        self.cancel.is_set()
    }

    /// Resolves once cancellation is requested (see [`Latch::wait`]).
    pub async fn cancelled(&self) {
        self.cancel.wait().await
    }
}

/// The active run of a thread (guidance runs do not hold a thread).
#[derive(Debug)]
pub struct ActiveRun {
    pub run_id: String,
    /// When it was admitted (ms since the epoch).
    pub since_ms: i64,
    pub execution_id: String,
    pub control: Arc<RunControl>,
}

/// One thread in memory.
#[derive(Debug, Default)]
pub struct ThreadState {
    /// `None`: no binding yet (or not loaded).
    pub doc: Option<ThreadDoc>,
    pub active: Option<ActiveRun>,
    loaded: bool,
}

impl ThreadState {
    /// Held by a run, or waiting for interrupt answers.
    fn in_use(&self) -> bool {
        self.active.is_some() || self.doc.as_ref().is_some_and(ThreadDoc::is_waiting)
    }
}

/// A thread's slot in the registry.
#[derive(Debug, Default)]
pub struct Slot {
    state: tokio::sync::Mutex<ThreadState>,
}

/// A thread, locked and loaded.
pub type Locked<'a> = tokio::sync::MutexGuard<'a, ThreadState>;

impl Slot {
    /// Locks the thread. Its document is loaded by [`Threads::lock`].
    pub async fn lock(&self) -> Locked<'_> {
        self.state.lock().await
    }

    fn in_use(&self) -> bool {
        match self.state.try_lock() {
            Ok(st) => st.in_use(),
            Err(_) => true,
        }
    }
}

/// The registry.
pub struct Threads {
    store: Arc<dyn ThreadStore>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Soft cap of threads kept in memory.
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

    pub fn store(&self) -> &Arc<dyn ThreadStore> {
        &self.store
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of a thread (created empty when unknown).
    pub fn slot(&self, thread_id: &str) -> Arc<Slot> {
        let mut map = self.map();
        if map.len() >= self.cap && !map.contains_key(thread_id) {
            // Keep what is referenced elsewhere, locked, running or waiting for answers.
            map.retain(|_, slot| Arc::strong_count(slot) > 1 || slot.in_use());
        }
        map.entry(thread_id.to_owned())
            .or_insert_with(|| Arc::new(Slot::default()))
            .clone()
    }

    /// Locks a thread and loads its document if it is not in memory yet. A failed load leaves
    /// it unloaded (the next access tries again).
    pub async fn lock<'a>(
        &self,
        slot: &'a Slot,
        thread_id: &str,
    ) -> Result<Locked<'a>, StoreError> {
        let mut st = slot.lock().await;
        if !st.loaded {
            st.doc = self.store.load(thread_id).await?;
            st.loaded = true;
        }
        Ok(st)
    }

    /// True when any thread in memory is held by a run or waits for answers (idle shutdown).
    pub fn busy(&self) -> bool {
        let slots: Vec<Arc<Slot>> = self.map().values().cloned().collect();
        slots.iter().any(|s| s.in_use())
    }

    /// Makes `next` the thread's document: durable first, then in memory, so a failed save
    /// changes nothing.
    pub async fn store_doc(&self, st: &mut ThreadState, next: ThreadDoc) -> Result<(), StoreError> {
        self.store.save(&next).await?;
        st.doc = Some(next);
        Ok(())
    }

    /// Changes the thread's document in memory, then saves it; the change stays even when the
    /// save fails. For facts that hold whether or not the disk records them (a task was
    /// cancelled, an execution ended): this process must not offer what is gone. After a
    /// restart, a stale document only makes the gateway cancel a task once more.
    pub async fn record(
        &self,
        st: &mut ThreadState,
        change: impl FnOnce(&mut ThreadDoc),
    ) -> Option<Result<(), StoreError>> {
        let doc = st.doc.as_mut()?;
        change(doc);
        Some(self.store.save(doc).await)
    }

    /// Changes the thread's document with `change`, durable first: on a failed save the
    /// document stays as it was. `None` when the thread has no document.
    pub async fn edit<R>(
        &self,
        st: &mut ThreadState,
        change: impl FnOnce(&mut ThreadDoc) -> R,
    ) -> Option<Result<R, StoreError>> {
        let mut next = st.doc.clone()?;
        let r = change(&mut next);
        Some(self.store_doc(st, next).await.map(|()| r))
    }
}
