//! What the gateway adds to, and learns from, each kernel call: the W3C trace context of the
//! call's span (or, with tracing off, the client's own headers, passed on unchanged), and the
//! call's duration by method.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};

use super::{otel, Metrics};

tokio::task_local! {
    /// The client's `traceparent`/`tracestate` of the request a task serves.
    static INCOMING: Vec<(HeaderName, HeaderValue)>;
}

/// Runs `fut` with the client's trace headers at hand for its kernel calls.
pub fn with_incoming<F: Future>(
    headers: Vec<(HeaderName, HeaderValue)>,
    fut: F,
) -> impl Future<Output = F::Output> {
    INCOMING.scope(headers, fut)
}

/// The client's trace headers of the current task (empty outside [`with_incoming`]).
pub fn incoming() -> Vec<(HeaderName, HeaderValue)> {
    INCOMING.try_with(Clone::clone).unwrap_or_default()
}

/// The observer every kernel client of the gateway has.
pub struct KernelObserver {
    metrics: Arc<Metrics>,
}

impl KernelObserver {
    pub fn new(metrics: Arc<Metrics>) -> Arc<KernelObserver> {
        Arc::new(KernelObserver { metrics })
    }
}

impl a2a::Observer for KernelObserver {
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        let ours = otel::current_headers();
        if ours.is_empty() {
            incoming()
        } else {
            ours
        }
    }

    fn finished(&self, method: &'static str, took: Duration, _ok: bool) {
        self.metrics.kernel_request(method, took);
    }
}
