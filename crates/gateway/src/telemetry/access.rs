//! The access log and the HTTP counters: one line per request (method, route, status, duration,
//! bytes; never a body, a query or a header) and `agui_http_requests_total{route,status}`.
//!
//! The counter is bumped when the answer's head is ready; the line is written when its body is
//! done, so that an event stream's line tells how long the stream lasted and how much it carried.
//! A body dropped unfinished (its client went away) is logged as `complete=false`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::Metrics;

/// The route of a request, as a label: the matched route's pattern (one of the gateway's, a
/// bounded set), or `other` (an unknown path, the console's files).
fn route_label(req: &Request) -> &'static str {
    const ROUTES: [&str; 14] = [
        "/",
        "/health",
        "/live",
        "/ready",
        "/extensions/iac-code/v1/executions/{execution_id}/cancel",
        "/extensions/iac-code/v1/executions/{execution_id}/subscribe",
        "/threads",
        "/threads/{thread_id}",
        "/threads/{thread_id}/runs/{run_id}/events",
        "/threads/{thread_id}/messages",
        "/threads/{thread_id}/connect",
        "/agents/state",
        "/capabilities",
        "/cluster/v1/hello",
    ];
    req.extensions()
        .get::<MatchedPath>()
        .and_then(|p| ROUTES.iter().find(|r| **r == p.as_str()))
        .copied()
        .unwrap_or("other")
}

/// The middleware: counts the request and wraps the body so that its line is written at its end.
pub async fn layer(metrics: Arc<Metrics>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = route_label(&req);
    let method = req.method().clone();
    let response = next.run(req).await;
    let status = response.status().as_u16();
    metrics.http_request(route, status);
    let (parts, body) = response.into_parts();
    let body = Body::new(Logged {
        inner: body,
        line: Line {
            method,
            route,
            status,
            started,
            bytes: 0,
            complete: false,
        },
    });
    Response::from_parts(parts, body)
}

/// What the access line says.
struct Line {
    method: axum::http::Method,
    route: &'static str,
    status: u16,
    started: Instant,
    bytes: u64,
    complete: bool,
}

/// A response body that counts its bytes and writes the access line when it is dropped.
struct Logged {
    inner: Body,
    line: Line,
}

impl Drop for Logged {
    fn drop(&mut self) {
        let l = &self.line;
        // hyper stops polling a body that says it has ended (a sized body after its last
        // frame), and never polls the body of an answer to HEAD.
        let complete =
            l.complete || self.inner.is_end_stream() || l.method == axum::http::Method::HEAD;
        tracing::info!(
            target: "iac_code_agui::access",
            method = %l.method,
            route = l.route,
            status = l.status,
            duration_ms = (l.started.elapsed().as_secs_f64() * 1e6).round() / 1000.0,
            bytes = l.bytes,
            complete,
            "request"
        );
    }
}

impl HttpBody for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.line.bytes += data.len() as u64;
                }
            }
            Poll::Ready(None) => this.line.complete = true,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
