//! A store that times its saves and counts their failures (`agui_state_save_*`), each save in a
//! trace span of its own (a child of the run or admission that saves).

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument as _;

use super::{Admission, BoxFuture, Claim, Decide, Lease, StoreError, ThreadDoc, ThreadStore};
use crate::telemetry::Metrics;

pub struct Metered {
    inner: Arc<dyn ThreadStore>,
    metrics: Arc<Metrics>,
}

impl Metered {
    pub fn wrap(inner: Arc<dyn ThreadStore>, metrics: Arc<Metrics>) -> Arc<dyn ThreadStore> {
        Arc::new(Metered { inner, metrics })
    }
}

impl ThreadStore for Metered {
    fn load(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        self.inner.load(thread_id)
    }

    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
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

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.flush()
    }

    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        self.inner.pending_interrupts()
    }

    fn shared(&self) -> bool {
        self.inner.shared()
    }

    fn claim(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.claim(thread_id)
    }

    fn holder(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.inner.holder(thread_id)
    }

    fn holds(&self, thread_id: &str) -> bool {
        self.inner.holds(thread_id)
    }

    fn lease(&self) -> Option<std::sync::Arc<Lease>> {
        self.inner.lease()
    }

    fn instance_id(&self) -> Option<String> {
        self.inner.instance_id()
    }

    fn release(&self) -> BoxFuture<'static, ()> {
        self.inner.release()
    }

    /// The admission's durable write counts as a save (timed, in a span of its own), when the
    /// decision wrote one: a refusal that changes nothing is no save.
    fn admit<'a>(
        &'a self,
        thread_id: &'a str,
        cached: Option<ThreadDoc>,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        let span = tracing::info_span!("agui.state_save");
        let wrote = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let noted = wrote.clone();
        let decide: Decide<'a> = Box::new(move |doc, held| {
            let next = decide(doc, held);
            noted.store(next.is_some(), std::sync::atomic::Ordering::Relaxed);
            next
        });
        let admit = span.in_scope(|| self.inner.admit(thread_id, cached, held, decide));
        Box::pin(
            async move {
                let started = Instant::now();
                let done = admit.await;
                // A store that failed before deciding (unreachable) failed its save too.
                if wrote.load(std::sync::atomic::Ordering::Relaxed) || done.is_err() {
                    self.metrics.state_save(started.elapsed(), done.is_ok());
                }
                done
            }
            .instrument(span),
        )
    }
}
