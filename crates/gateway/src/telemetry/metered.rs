//! The store as the run core sees it: its writes timed and their failures counted
//! (`agui_state_save_*`), each in a trace span of its own (a child of the run or admission that
//! writes). A write is a document's save, an admission that saves, or a run's end; each part of
//! the store is wrapped by an implementation of its trait, every method spelt out, so a write
//! method added to a trait does not compile here until it is decided whether it is timed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument as _;

use crate::telemetry::Metrics;
use store::{
    listing, transcript, Admission, BoxFuture, Claim, Decide, Documents, History, Lease, Ownership,
    Store, StoreError, ThreadDoc, TranscriptAppend,
};

/// `store` with its writes measured.
pub fn metered(store: Store, metrics: Arc<Metrics>) -> Store {
    let documents: Arc<dyn Documents> = Arc::new(Metered {
        inner: store.documents().clone(),
        metrics: metrics.clone(),
    });
    let ownership = store.ownership().map(|o| -> Arc<dyn Ownership> {
        Arc::new(Metered {
            inner: o.clone(),
            metrics: metrics.clone(),
        })
    });
    let history = store.history().map(|h| -> Arc<dyn History> {
        Arc::new(Metered {
            inner: h.clone(),
            metrics: metrics.clone(),
        })
    });
    Store::from_parts(documents, ownership, history)
}

/// One part of a store, measured.
struct Metered<T: ?Sized> {
    inner: Arc<T>,
    metrics: Arc<Metrics>,
}

impl<T: ?Sized> Metered<T> {
    /// `write` in an `agui.state_save` span, timed and counted when `counts` says it wrote (a
    /// refusal that changes nothing is no save).
    fn timed<'a, R: Send + 'a>(
        &self,
        write: impl FnOnce() -> BoxFuture<'a, R>,
        counts: impl FnOnce(&R) -> Option<bool> + Send + 'a,
    ) -> BoxFuture<'a, R> {
        let span = tracing::info_span!("agui.state_save");
        let write = span.in_scope(write);
        let metrics = self.metrics.clone();
        Box::pin(
            async move {
                let started = Instant::now();
                let done = write.await;
                if let Some(ok) = counts(&done) {
                    metrics.state_save(started.elapsed(), ok);
                }
                done
            }
            .instrument(span),
        )
    }
}

impl Documents for Metered<dyn Documents> {
    fn load(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        self.inner.load(thread_id)
    }
    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        self.timed(|| self.inner.save(doc), |r| Some(r.is_ok()))
    }
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.flush()
    }
    fn reachable(&self) -> BoxFuture<'static, Result<(), String>> {
        self.inner.reachable()
    }
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        self.inner.pending_interrupts()
    }
}

impl Ownership for Metered<dyn Ownership> {
    fn claim(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.claim(thread_id)
    }
    fn holder(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.holder(thread_id)
    }
    /// Its durable write counts as a save when the decision wrote one; a store that failed
    /// before deciding (unreachable) failed its save too.
    fn admit<'a>(
        &'a self,
        thread_id: &'a str,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        let wrote = Arc::new(AtomicBool::new(false));
        let noted = wrote.clone();
        let decide: Decide<'a> = Box::new(move |doc, held, incarnation| {
            let next = decide(doc, held, incarnation);
            noted.store(next.is_some(), Ordering::Relaxed);
            next
        });
        self.timed(
            || self.inner.admit(thread_id, held, decide),
            move |r| (wrote.load(Ordering::Relaxed) || r.is_err()).then_some(r.is_ok()),
        )
    }
    fn held_by(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<String>, StoreError>> {
        self.inner.held_by(thread_id)
    }
    fn holds(&self, thread_id: &str) -> bool {
        self.inner.holds(thread_id)
    }
    fn lease(&self) -> Arc<Lease> {
        self.inner.lease()
    }
    fn instance_id(&self) -> String {
        self.inner.instance_id()
    }
    fn forward_key(&self) -> String {
        self.inner.forward_key()
    }
    fn forget(&self, thread_id: &str) {
        self.inner.forget(thread_id)
    }
    fn release(&self) -> BoxFuture<'static, ()> {
        self.inner.release()
    }
}

impl History for Metered<dyn History> {
    /// Not a save: a transcript that cannot be written is counted by the run that wrote it.
    fn append_transcript(
        &self,
        thread_id: &str,
        entries: TranscriptAppend,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.append_transcript(thread_id, entries)
    }
    /// Timed as a save of the document; the transcript's outcome is the caller's to count.
    fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)> {
        self.timed(
            || self.inner.save_ending(doc, transcript),
            |(saved, _)| Some(saved.is_ok()),
        )
    }
    fn read_transcript(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> BoxFuture<'static, Result<transcript::Page, StoreError>> {
        self.inner.read_transcript(thread_id, before, limit)
    }
    fn list_threads(
        &self,
        query: listing::ListQuery,
    ) -> BoxFuture<'static, Result<listing::ListPage, StoreError>> {
        self.inner.list_threads(query)
    }
    fn update_thread(
        &self,
        thread_id: &str,
        patch: listing::ThreadPatch,
    ) -> BoxFuture<'static, Result<Option<listing::ThreadSummary>, StoreError>> {
        self.inner.update_thread(thread_id, patch)
    }
    fn delete_thread(&self, thread_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        self.inner.delete_thread(thread_id)
    }
    fn incarnation(&self, thread_id: &str) -> BoxFuture<'static, Result<u64, StoreError>> {
        self.inner.incarnation(thread_id)
    }
}
