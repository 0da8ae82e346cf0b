//! The store as the run core sees it: its saves timed and their failures counted
//! (`agui_state_save_*`), each save in a trace span of its own (a child of the run or admission
//! that saves). Every other operation is the store's own, reached through `Deref`.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument as _;

use crate::telemetry::Metrics;
use store::{Admission, BoxFuture, Decide, StoreError, ThreadDoc, ThreadStore};

/// A store whose writes are measured: `save` and `admit` here, the rest the store's.
#[derive(Clone)]
pub struct Metered {
    inner: Arc<dyn ThreadStore>,
    metrics: Arc<Metrics>,
}

impl Deref for Metered {
    type Target = dyn ThreadStore;

    fn deref(&self) -> &Self::Target {
        &*self.inner
    }
}

impl Metered {
    pub fn new(inner: Arc<dyn ThreadStore>, metrics: Arc<Metrics>) -> Metered {
        Metered { inner, metrics }
    }

    /// [`ThreadStore::save`], timed.
    pub fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        let span = tracing::info_span!("agui.state_save");
        let save = span.in_scope(|| self.inner.save(doc));
        let metrics = self.metrics.clone();
        Box::pin(
            async move {
                let started = Instant::now();
                let saved = save.await;
                metrics.state_save(started.elapsed(), saved.is_ok());
                saved
            }
            .instrument(span),
        )
    }

    /// [`ThreadStore::save_ending`], timed as a save (of the document; the transcript's
    /// outcome is the caller's to count).
    pub fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<store::TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)> {
        let span = tracing::info_span!("agui.state_save");
        let save = span.in_scope(|| self.inner.save_ending(doc, transcript));
        let metrics = self.metrics.clone();
        Box::pin(
            async move {
                let started = Instant::now();
                let (saved, appended) = save.await;
                metrics.state_save(started.elapsed(), saved.is_ok());
                (saved, appended)
            }
            .instrument(span),
        )
    }

    /// [`ThreadStore::admit`]: its durable write counts as a save (timed, in a span of its own),
    /// when the decision wrote one: a refusal that changes nothing is no save.
    pub fn admit<'a>(
        &'a self,
        thread_id: &'a str,
        cached: Option<ThreadDoc>,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        let span = tracing::info_span!("agui.state_save");
        let wrote = Arc::new(AtomicBool::new(false));
        let noted = wrote.clone();
        let decide: Decide<'a> = Box::new(move |doc, held| {
            let next = decide(doc, held);
            noted.store(next.is_some(), Ordering::Relaxed);
            next
        });
        let admit = span.in_scope(|| self.inner.admit(thread_id, cached, held, decide));
        Box::pin(
            async move {
                let started = Instant::now();
                let done = admit.await;
                // A store that failed before deciding (unreachable) failed its save too.
                if wrote.load(Ordering::Relaxed) || done.is_err() {
                    self.metrics.state_save(started.elapsed(), done.is_ok());
                }
                done
            }
            .instrument(span),
        )
    }
}
