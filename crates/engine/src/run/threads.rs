//! The thread registry: each thread's document in memory behind its own async lock.
//!
//! One lock per thread serialises that thread's admission, changes and saves; different threads
//! never wait on each other, and no lock is held while a stream is read. The registry's own map
//! sits behind a short std mutex, never held across an `.await`. Idle threads are dropped from
//! memory (their state is on disk) when the map grows past its cap.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::telemetry::{InterruptEvent, Telemetry};
use store::{Admission, Claim, Decide, Peer, Store, StoreError, ThreadDoc};

/// Controls of an active run, shared with the cancellation extension.
#[derive(Debug, Default)]
pub struct RunControl {
    cancel: CancellationToken,
}

impl RunControl {
    /// Asks the run to stop and cancel its task (as soon as the kernel names it).
    pub fn request_cancel(&self) {
        self.cancel.cancel();
    }

    pub fn is_cancel_requested(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves once cancellation is requested (at once when it was).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
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

/// Where a thread is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// By this instance; `took_over` when it just became so (its holder was dead).
    Here { took_over: bool },
    /// By another live instance.
    Elsewhere(Peer),
}

/// One thread in memory.
#[derive(Debug, Default)]
pub struct ThreadState {
    /// `None`: no binding yet (or not loaded).
    doc: Option<ThreadDoc>,
    active: Option<ActiveRun>,
    loaded: bool,
    /// Bumped whenever this instance's hold on the thread ends or begins anew (another instance
    /// took it, or this one took it over): a run admitted in an earlier hold writes nothing.
    hold: u64,
}

impl ThreadState {
    /// The hold a run admitted now belongs to.
    pub fn hold(&self) -> u64 {
        self.hold
    }

    /// The thread's document as this instance has it (`None`: no binding yet).
    pub fn doc(&self) -> Option<&ThreadDoc> {
        self.doc.as_ref()
    }

    /// The run of this instance that holds the thread.
    pub fn active(&self) -> Option<&ActiveRun> {
        self.active.as_ref()
    }

    /// A run takes the thread (admission), or lets it go (`None`).
    pub fn set_active(&mut self, run: Option<ActiveRun>) {
        self.active = run;
    }
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
    store: Store,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Soft cap of threads kept in memory.
    cap: usize,
    metrics: Arc<dyn Telemetry>,
    unloaded: Mutex<Unloaded>,
}

/// Interrupts pending in stored threads that are not loaded yet, as the start-up count found them
/// (`agui_pending_interrupts` counts them until their thread is loaded, then from its document).
#[derive(Debug, Default)]
struct Unloaded {
    /// The count runs: threads loaded meanwhile are counted from their documents, not by it.
    counting: bool,
    loaded_meanwhile: HashSet<String>,
    pending: HashMap<String, usize>,
}

/// The pending interrupts of a document, keyed by execution.
fn pending_keys(doc: Option<&ThreadDoc>) -> Vec<(&str, &str)> {
    doc.map_or_else(Vec::new, |d| {
        d.execution
            .pending
            .iter()
            .map(|(id, _)| (d.execution.execution_id.as_str(), id.as_str()))
            .collect()
    })
}

/// What a change of a thread's document did to its interrupts: how many appeared, and why each
/// one that went away did (answered, expired, or cleared without an answer).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct InterruptChanges {
    pub created: usize,
    pub resolved: usize,
    pub expired: usize,
    pub cleared: usize,
}

pub(crate) fn interrupt_changes(before: Option<&ThreadDoc>, after: &ThreadDoc) -> InterruptChanges {
    let (old, new) = (pending_keys(before), pending_keys(Some(after)));
    let mut c = InterruptChanges {
        created: new.iter().filter(|k| !old.contains(k)).count(),
        ..Default::default()
    };
    for (execution, id) in old.iter().filter(|k| !new.contains(k)) {
        let key = ((*execution).to_owned(), (*id).to_owned());
        if after.expired_interrupts.contains(&key) {
            c.expired += 1;
        } else if after
            .applied_resume_digests
            .iter()
            .any(|a| a.execution_id == *execution && a.interrupt_id == *id)
        {
            c.resolved += 1;
        } else {
            c.cleared += 1;
        }
    }
    c
}

impl Threads {
    pub fn new(store: Store, metrics: Arc<dyn Telemetry>) -> Threads {
        Threads {
            store,
            slots: Mutex::new(HashMap::new()),
            cap: 10_000,
            metrics,
            unloaded: Mutex::new(Unloaded {
                counting: true,
                ..Default::default()
            }),
        }
    }

    fn unloaded(&self) -> std::sync::MutexGuard<'_, Unloaded> {
        self.unloaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the interrupts pending in the store (once, at start-up; until it has, threads
    /// loaded meanwhile are set aside so that none is counted twice).
    pub async fn count_stored_interrupts(&self) {
        let found = self.store.documents().pending_interrupts().await;
        let mut u = self.unloaded();
        let mut added = 0;
        for (thread, n) in found {
            if !u.loaded_meanwhile.contains(&thread) {
                added += n;
                u.pending.insert(thread, n);
            }
        }
        u.counting = false;
        u.loaded_meanwhile = HashSet::new();
        drop(u);
        self.metrics.pending_changed(added as i64);
    }

    /// A thread's document was loaded: it counts from now on, not the start-up figure.
    fn loaded(&self, thread_id: &str, pending: usize) {
        let mut u = self.unloaded();
        let counted = u.pending.remove(thread_id).unwrap_or(0);
        if u.counting {
            u.loaded_meanwhile.insert(thread_id.to_owned());
        }
        drop(u);
        self.metrics
            .pending_changed(pending as i64 - counted as i64);
    }

    /// What this process has of a thread is replaced by what a shared store read: counted as a
    /// load (the interrupts were created elsewhere), not as changes.
    fn replace(&self, st: &mut ThreadState, thread_id: &str, doc: Option<ThreadDoc>) {
        if st.loaded {
            let old = st.doc.as_ref().map_or(0, |d| d.execution.pending.len());
            self.metrics.pending_changed(-(old as i64));
        }
        let pending = doc.as_ref().map_or(0, |d| d.execution.pending.len());
        self.loaded(thread_id, pending);
        st.doc = doc;
        st.loaded = true;
    }

    /// Another instance holds the thread: what this process had of it is stale, and the runs of
    /// its hold here write nothing more.
    fn forget(&self, st: &mut ThreadState) {
        if st.loaded {
            let old = st.doc.as_ref().map_or(0, |d| d.execution.pending.len());
            self.metrics.pending_changed(-(old as i64));
        }
        st.doc = None;
        st.loaded = false;
        st.hold += 1;
    }

    /// [`Threads::forget`], for tests of what a run does once its hold ended.
    #[cfg(test)]
    pub(crate) fn forget_for_tests(&self, st: &mut ThreadState) {
        self.forget(st)
    }

    /// Counts what a change of a document did to its interrupts.
    fn account(&self, before: Option<&ThreadDoc>, after: &ThreadDoc) {
        let c = interrupt_changes(before, after);
        let m = &self.metrics;
        m.interrupts(InterruptEvent::Created, c.created);
        m.interrupts(InterruptEvent::Resolved, c.resolved);
        m.interrupts(InterruptEvent::Expired, c.expired);
        m.interrupts(InterruptEvent::Cancelled, c.cleared);
        m.pending_changed(c.created as i64 - (c.resolved + c.expired + c.cleared) as i64);
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The slot of a thread (created empty when unknown).
    pub fn slot(&self, thread_id: &str) -> Arc<Slot> {
        let mut map = self.map();
        let mut evicted = Vec::new();
        if map.len() >= self.cap && !map.contains_key(thread_id) {
            // Keep what is referenced elsewhere, locked, running or waiting for answers.
            map.retain(|id, slot| {
                let keep = Arc::strong_count(slot) > 1 || slot.in_use();
                if !keep {
                    evicted.push(id.clone());
                }
                keep
            });
        }
        let slot = map
            .entry(thread_id.to_owned())
            .or_insert_with(|| Arc::new(Slot::default()))
            .clone();
        drop(map);
        // What the store keeps per held thread goes with the thread (bounded like the map).
        for id in evicted {
            self.store.forget(&id);
        }
        slot
    }

    /// Locks a thread and loads its document if it is not in memory yet (or, from a shared
    /// store, when this instance does not hold the thread: another may have changed it). A
    /// failed load leaves it unloaded (the next access tries again).
    pub async fn lock<'a>(
        &self,
        slot: &'a Slot,
        thread_id: &str,
    ) -> Result<Locked<'a>, StoreError> {
        let mut st = slot.lock().await;
        if st.loaded && self.store.shared() && !self.store.holds(thread_id) {
            let doc = self.store.documents().load(thread_id).await?;
            self.replace(&mut st, thread_id, doc);
            return Ok(st);
        }
        if !st.loaded {
            st.doc = self.store.documents().load(thread_id).await?;
            st.loaded = true;
            let pending = st.doc.as_ref().map_or(0, |d| d.execution.pending.len());
            self.loaded(thread_id, pending);
        }
        Ok(st)
    }

    /// Locks a thread for an admission: loaded first from a store of this process alone; a
    /// shared store reads it in [`Threads::admit`] itself.
    pub async fn lock_for_admission<'a>(
        &self,
        slot: &'a Slot,
        thread_id: &str,
    ) -> Result<Locked<'a>, StoreError> {
        if self.store.shared() {
            Ok(slot.lock().await)
        } else {
            self.lock(slot, thread_id).await
        }
    }

    /// Admits on the locked thread `st`: the store decides with `decide` and saves in one step
    /// ([`store::Ownership::admit`]); the thread's document in memory becomes the
    /// store's.
    pub async fn admit(
        &self,
        st: &mut ThreadState,
        thread_id: &str,
        decide: Decide<'_>,
    ) -> Result<Holder, StoreError> {
        let cached = if self.store.shared() {
            None
        } else {
            st.doc.clone()
        };
        match self
            .store
            .admit(thread_id, cached, st.active.is_some(), decide)
            .await?
        {
            Admission::Elsewhere(peer) => {
                self.forget(st);
                Ok(Holder::Elsewhere(peer))
            }
            Admission::Here {
                read,
                current,
                took_over,
            } => {
                if let Some(read) = read {
                    self.replace(st, thread_id, read);
                }
                if took_over {
                    st.active = None;
                    st.hold += 1;
                }
                if let Some(next) = &current {
                    if st.doc.as_ref() != Some(next) {
                        self.account(st.doc.as_ref(), next);
                    }
                }
                st.doc = current;
                st.loaded = true;
                Ok(Holder::Here { took_over })
            }
        }
    }

    /// Locks a thread for a change that is no admission (a cancellation): a shared store hands it
    /// to this instance first (taken over when its holder is dead), or says who holds it.
    pub async fn claim<'a>(
        &self,
        slot: &'a Slot,
        thread_id: &str,
    ) -> Result<(Locked<'a>, Holder), StoreError> {
        let mut st = slot.lock().await;
        match self.store.claim(thread_id).await? {
            Claim::Elsewhere(peer) => {
                self.forget(&mut st);
                Ok((st, Holder::Elsewhere(peer)))
            }
            Claim::Here { current, took_over } => {
                match current {
                    Some(doc) => self.replace(&mut st, thread_id, doc),
                    None if !st.loaded => {
                        let doc = self.store.documents().load(thread_id).await?;
                        self.replace(&mut st, thread_id, doc);
                    }
                    None => {}
                }
                if took_over {
                    st.active = None;
                    st.hold += 1;
                }
                Ok((st, Holder::Here { took_over }))
            }
        }
    }

    /// Where a request for a thread is served: here, or at the instance that holds it (what
    /// this process had of the thread is then dropped: it no longer counts it, and may evict it).
    pub async fn holder(&self, thread_id: &str) -> Result<Holder, StoreError> {
        Ok(match self.store.holder(thread_id).await? {
            Claim::Elsewhere(peer) => {
                let slot = self.map().get(thread_id).cloned();
                if let Some(slot) = slot {
                    let mut st = slot.lock().await;
                    if st.loaded {
                        self.forget(&mut st);
                    }
                }
                Holder::Elsewhere(peer)
            }
            Claim::Here { took_over, .. } => Holder::Here { took_over },
        })
    }

    /// True when any thread in memory is held by a run or waits for answers (idle shutdown).
    pub fn busy(&self) -> bool {
        let slots: Vec<Arc<Slot>> = self.map().values().cloned().collect();
        slots.iter().any(|s| s.in_use())
    }

    /// Makes `next` the thread's document: durable first, then in memory, so a failed save
    /// changes nothing.
    /// Deletes the thread from the store (see `History::delete_thread`) and forgets it here:
    /// whether there was one to delete.
    pub async fn delete(&self, st: &mut ThreadState, thread_id: &str) -> Result<bool, StoreError> {
        if !self.store.delete_thread(thread_id).await? {
            return Ok(false);
        }
        st.doc = None;
        self.store.forget(thread_id);
        Ok(true)
    }

    pub async fn store_doc(&self, st: &mut ThreadState, next: ThreadDoc) -> Result<(), StoreError> {
        self.store.documents().save(&next).await?;
        self.account(st.doc.as_ref(), &next);
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
        let before = doc.clone();
        change(doc);
        self.account(Some(&before), doc);
        Some(self.store.documents().save(doc).await)
    }

    /// [`Threads::record`] at a run's end: the run's messages appended to the transcript with
    /// the save (one durable write where the store can). The outcomes of the save and of the
    /// append; `None` when the thread has no document (nothing written).
    pub async fn record_ending(
        &self,
        st: &mut ThreadState,
        change: impl FnOnce(&mut ThreadDoc),
        transcript: Option<store::TranscriptAppend>,
    ) -> Option<(Result<(), StoreError>, Result<(), StoreError>)> {
        let doc = st.doc.as_mut()?;
        let before = doc.clone();
        change(doc);
        self.account(Some(&before), doc);
        Some(self.store.save_ending(doc, transcript).await)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::decide::testing::doc_with_pending;
    use crate::telemetry::testing::Counts;
    use store::{AppliedDigest, BoxFuture, Lease, Ownership};

    /// A shared store that remembers which threads it was told to forget (nothing else of it
    /// is asked).
    #[derive(Default)]
    struct Forgetful(Mutex<Vec<String>>);

    impl Ownership for Forgetful {
        fn claim(&self, _: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
            unimplemented!("not asked")
        }
        fn holder(&self, _: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
            unimplemented!("not asked")
        }
        fn admit<'a>(
            &'a self,
            _: &'a str,
            _: bool,
            _: Decide<'a>,
        ) -> BoxFuture<'a, Result<Admission, StoreError>> {
            unimplemented!("not asked")
        }
        fn held_by(&self, _: &str) -> BoxFuture<'static, Result<Option<String>, StoreError>> {
            unimplemented!("not asked")
        }
        fn holds(&self, _: &str) -> bool {
            true
        }
        fn lease(&self) -> Arc<Lease> {
            Arc::new(Lease::new(std::time::Duration::from_secs(15)))
        }
        fn instance_id(&self) -> String {
            "me".into()
        }
        fn forward_key(&self) -> String {
            "key".into()
        }
        fn forget(&self, thread_id: &str) {
            self.0.lock().unwrap().push(thread_id.to_owned());
        }
        fn release(&self) -> BoxFuture<'static, ()> {
            Box::pin(async {})
        }
    }

    /// Threads the registry evicts are forgotten by the store too (the PostgreSQL store's
    /// epochs are bounded like the registry); a thread still referenced is kept and not
    /// forgotten.
    #[test]
    fn evicted_threads_are_forgotten_by_the_store() {
        let store = Arc::new(Forgetful::default());
        let documents = Arc::new(store::Unavailable("not asked".into()));
        let parts = Store::from_parts(documents, Some(store.clone()), None);
        let mut threads = Threads::new(parts, Arc::new(Counts::default()));
        threads.cap = 3;
        let kept = threads.slot("kept");
        threads.slot("a");
        threads.slot("b");
        assert!(store.0.lock().unwrap().is_empty());
        threads.slot("c");
        let mut forgotten = store.0.lock().unwrap().clone();
        forgotten.sort();
        assert_eq!(forgotten, ["a", "b"]);
        assert_eq!(threads.map().len(), 2, "kept and c");
        drop(kept);
    }

    #[test]
    fn interrupt_changes_tell_created_answered_expired_and_cleared_apart() {
        let none = doc_with_pending(&[]);
        let two = doc_with_pending(&[("p1", None), ("p2", None)]);
        assert_eq!(
            interrupt_changes(Some(&none), &two),
            InterruptChanges {
                created: 2,
                ..Default::default()
            }
        );
        assert_eq!(
            interrupt_changes(Some(&two), &two),
            InterruptChanges::default()
        );
        // p1 answered, p2 expired.
        let mut after = none.clone();
        after.applied_resume_digests.insert(AppliedDigest {
            execution_id: "exec-0".into(),
            interrupt_id: "p1".into(),
            digest: "d".into(),
        });
        after
            .expired_interrupts
            .insert(("exec-0".into(), "p2".into()));
        assert_eq!(
            interrupt_changes(Some(&two), &after),
            InterruptChanges {
                resolved: 1,
                expired: 1,
                ..Default::default()
            }
        );
        // Cleared without an answer (cancelled), and the same ids of a new execution are new.
        assert_eq!(interrupt_changes(Some(&two), &none).cleared, 2);
        let mut next = two.clone();
        next.execution.execution_id = "exec-1".into();
        assert_eq!(
            interrupt_changes(Some(&two), &next),
            InterruptChanges {
                created: 2,
                cleared: 2,
                ..Default::default()
            }
        );
        // A first document.
        assert_eq!(interrupt_changes(None, &two).created, 2);
    }
}
