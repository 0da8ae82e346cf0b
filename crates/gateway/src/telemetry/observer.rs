//! What the gateway adds to, and learns from, each kernel call: the W3C trace context of the
//! call's span (or, with tracing off, the client's own headers, passed on unchanged), and the
//! call's duration by method.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};

use super::{otel, Metrics};

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
            engine::trace::incoming()
        } else {
            ours
        }
    }

    fn finished(&self, method: &'static str, took: Duration, _ok: bool) {
        self.metrics.kernel_request(method, took);
    }
}
