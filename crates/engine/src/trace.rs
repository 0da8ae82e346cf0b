//! The client's W3C trace headers (`traceparent`, `tracestate`) of the request a task serves,
//! for the kernel calls it makes: the gateway's kernel observer passes them on when it has no
//! trace span of its own.

use std::future::Future;

use http::{HeaderName, HeaderValue};

tokio::task_local! {
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
