//! One kernel request through the egress: its route and capability checked, the user's budget,
//! a place among `--llm-max-requests`, its body read within bounds, then sent upstream with the
//! real credentials; the answer's status, headers and body pass back as they come (an event
//! stream is never held back), its usage read on the way and counted when it ends.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use serde_json::json;
use tokio::sync::OwnedSemaphorePermit;

use super::grants::{Account, Spend};
use super::usage::Scan;
use super::Inner;

/// The most bytes of a request body (a conversation with its tool results and images).
pub const MAX_BODY: usize = 32 * 1024 * 1024;
/// A request body must arrive whole within this.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest wait for a place among `--llm-max-requests`.
const QUEUE_WAIT: Duration = if cfg!(test) {
    Duration::from_millis(200)
} else {
    Duration::from_secs(30)
};
/// The upstream's answer head must come within this (a long completion not streamed).
const HEAD_TIMEOUT: Duration = Duration::from_secs(600);
/// The upstream's answer may pause this long between its pieces.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// What a request asks of the upstream: the routes iac-code's clients call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// OpenAI's `POST chat/completions` (and the capability probe's `GET models`).
    OpenAi,
    /// Anthropic's `POST v1/messages`.
    Anthropic,
}

/// The route of `method` on `rest` (the path after the kernel's capability), if it is one.
pub fn route(method: &http::Method, rest: &str) -> Option<Route> {
    match (method.as_str(), rest) {
        ("POST", "chat/completions" | "completions") => Some(Route::OpenAi),
        ("GET", "models") => Some(Route::OpenAi),
        ("POST", "v1/messages" | "messages") => Some(Route::Anthropic),
        _ => None,
    }
}

/// The headers not passed on either way: the connection's own, and the credentials the gateway
/// sets itself.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

fn credential(name: &HeaderName) -> bool {
    matches!(name.as_str(), "authorization" | "x-api-key" | "api-key")
}

/// The key a request presents: `Authorization: Bearer` (both SDKs iac-code uses), else
/// `x-api-key`; and whether it came as the latter (the upstream gets the operator's the same
/// way).
fn presented(headers: &HeaderMap) -> (Option<&str>, bool) {
    if let Some(b) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
    {
        return (Some(b.trim()), false);
    }
    let x = headers
        .get("x-api-key")
        .or_else(|| headers.get("api-key"))
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    (x, x.is_some())
}

/// An answer of the egress's own, in the shape the route's client reads errors in.
fn refusal(route: Option<Route>, status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = match route {
        Some(Route::Anthropic) => {
            json!({"type": "error", "error": {"type": code, "message": message}})
        }
        _ => json!({"error": {"message": message, "type": code, "code": code}}),
    };
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    // The SDKs' own retries would only repeat a refusal; a busy egress is worth another try.
    let retry = if status == StatusCode::SERVICE_UNAVAILABLE {
        "true"
    } else {
        "false"
    };
    h.insert("x-should-retry", HeaderValue::from_static(retry));
    r
}

/// Serves one request of a kernel's.
pub async fn serve(inner: Arc<Inner>, req: Request<Body>) -> Response<Body> {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().trim_start_matches('/');
    let (kernel, rest) = path.split_once('/').unwrap_or((path, ""));
    let Some(route) = route(&parts.method, rest) else {
        inner.metrics.llm_request("invalid", started.elapsed());
        return refusal(
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            "The LLM egress serves chat/completions, models and v1/messages only.",
        );
    };
    let (key, as_x_api_key) = presented(&parts.headers);
    let spend = inner.admit(kernel, key);
    let spend = match spend {
        Ok(s) => s,
        Err(why) => {
            tracing::warn!(reason = ?why, "an LLM request without a valid capability was refused");
            inner.metrics.llm_request("denied", started.elapsed());
            return refusal(
                Some(route),
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "The LLM egress did not accept this request's capability.",
            );
        }
    };
    if let Some(wait) = spend.account.as_deref().and_then(|a| inner.exhausted(a)) {
        inner.metrics.llm_request("budget", started.elapsed());
        if let Some(run) = &spend.refused {
            run.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut r = refusal(
            Some(route),
            StatusCode::TOO_MANY_REQUESTS,
            "llm_budget_exhausted",
            "This user's LLM token budget is spent for now.",
        );
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(wait.as_secs().max(1)),
        );
        return r;
    }
    let permit = match tokio::time::timeout(QUEUE_WAIT, inner.permits.clone().acquire_owned()).await
    {
        Ok(Ok(p)) => p,
        _ => {
            inner.metrics.llm_request("busy", started.elapsed());
            return refusal(
                Some(route),
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "The LLM egress has as many requests as it may forward at once.",
            );
        }
    };
    let body =
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => {
                inner.metrics.llm_request("invalid", started.elapsed());
                return refusal(
                    Some(route),
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "request_too_large",
                    "The request body is larger than the LLM egress takes (32 MiB).",
                );
            }
            Err(_) => {
                inner.metrics.llm_request("invalid", started.elapsed());
                return refusal(
                    Some(route),
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    "The request body did not arrive in time.",
                );
            }
        };
    let upstream = match upstream_request(&inner, &parts, rest, body, &spend, as_x_api_key) {
        Ok(r) => r,
        Err(e) => {
            inner.metrics.llm_request("invalid", started.elapsed());
            return refusal(
                Some(route),
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e,
            );
        }
    };
    let answer = tokio::time::timeout(HEAD_TIMEOUT, inner.client.send(upstream)).await;
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the LLM upstream could not be reached");
            inner.metrics.llm_request("failed", started.elapsed());
            return refusal(
                Some(route),
                StatusCode::BAD_GATEWAY,
                "api_error",
                "The LLM upstream could not be reached.",
            );
        }
        Err(_) => {
            inner.metrics.llm_request("failed", started.elapsed());
            return refusal(
                Some(route),
                StatusCode::GATEWAY_TIMEOUT,
                "api_error",
                "The LLM upstream did not answer in time.",
            );
        }
    };
    inner.metrics.llm_head(started.elapsed());
    let (mut head, incoming) = answer.into_parts();
    head.headers.retain_not(hop_by_hop);
    let scan = Scan::new(
        head.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let relay = Relay {
        body: incoming,
        scan: Some(scan),
        idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
        end: Some(End {
            inner: inner.clone(),
            account: spend.account,
            started,
            status: head.status,
            _permit: permit,
        }),
    };
    Response::from_parts(head, Body::new(relay))
}

/// Retains the headers `drop` does not name.
trait RetainNot {
    fn retain_not(&mut self, drop: fn(&HeaderName) -> bool);
}

impl RetainNot for HeaderMap {
    fn retain_not(&mut self, drop: fn(&HeaderName) -> bool) {
        let names: Vec<HeaderName> = self.keys().filter(|n| drop(n)).cloned().collect();
        for n in names {
            self.remove(n);
        }
    }
}

/// The request sent upstream: the upstream's URL with the route (and query), the kernel's
/// headers but the connection's and the credentials, the key (the run's, else the operator's)
/// as the kernel presented its capability, then the run's headers; the answer uncompressed, so
/// that its usage can be read.
fn upstream_request(
    inner: &Inner,
    parts: &http::request::Parts,
    rest: &str,
    body: Bytes,
    spend: &Spend,
    as_x_api_key: bool,
) -> Result<Request<Full<Bytes>>, &'static str> {
    let mut url = format!("{}/{rest}", inner.upstream.as_str().trim_end_matches('/'));
    if let Some(q) = parts.uri.query() {
        url.push('?');
        url.push_str(q);
    }
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(url)
        .body(Full::new(body))
        .map_err(|_| "The request cannot be sent upstream.")?;
    let h = req.headers_mut();
    for (name, value) in &parts.headers {
        if !hop_by_hop(name)
            && !credential(name)
            && name != header::CONTENT_LENGTH
            && name != header::ACCEPT_ENCODING
        {
            h.append(name.clone(), value.clone());
        }
    }
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    if let Some(key) = spend.key.as_deref().or(inner.key.as_deref()) {
        let (name, value) = if as_x_api_key {
            (HeaderName::from_static("x-api-key"), key.to_owned())
        } else {
            (header::AUTHORIZATION, format!("Bearer {key}"))
        };
        let mut value =
            HeaderValue::from_str(&value).map_err(|_| "The key is not a header value.")?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    for (name, value) in &spend.headers {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| "A header name is invalid.")?;
        let mut value = HeaderValue::from_str(value).map_err(|_| "A header value is invalid.")?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    Ok(req)
}

/// What is counted when an answer ends.
struct End {
    inner: Arc<Inner>,
    account: Account,
    started: Instant,
    status: StatusCode,
    _permit: OwnedSemaphorePermit,
}

/// The upstream's answer on its way to the kernel.
struct Relay {
    body: Incoming,
    scan: Option<Scan>,
    idle: Pin<Box<tokio::time::Sleep>>,
    end: Option<End>,
}

impl Relay {
    /// Counts the request once: its outcome, duration and tokens (`broken`: the upstream's
    /// answer failed or went silent).
    fn finish(&mut self, broken: bool) {
        let Some(end) = self.end.take() else { return };
        let tokens = self.scan.take().and_then(Scan::finish);
        let outcome = if broken {
            "failed"
        } else if end.status.is_success() {
            "ok"
        } else if end.status.is_client_error() {
            "upstream_4xx"
        } else if end.status.is_server_error() {
            "upstream_5xx"
        } else {
            "ok"
        };
        end.inner
            .metrics
            .llm_request(outcome, end.started.elapsed());
        if let Some(t) = tokens {
            end.inner.metrics.llm_tokens(t.input, t.output);
            if let Some(account) = &end.account {
                end.inner.spend(account, t.input, t.output);
            }
        } else if let Some(account) = &end.account {
            end.inner.spend(account, 0, 0);
        }
    }
}

impl http_body::Body for Relay {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.end.is_none() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(scan)) = (frame.data_ref(), this.scan.as_mut()) {
                    scan.feed(data);
                }
                let next = tokio::time::Instant::now() + IDLE_TIMEOUT;
                this.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(true);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish(false);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.idle.as_mut().poll(cx).is_ready() {
                    this.finish(true);
                    return Poll::Ready(Some(Err("the LLM upstream went silent".into())));
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Relay {
    /// The kernel left before the end: what was read is counted.
    fn drop(&mut self) {
        self.finish(false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_routes_iac_codes_clients_call_and_nothing_else() {
        use http::Method;
        assert_eq!(
            route(&Method::POST, "chat/completions"),
            Some(Route::OpenAi)
        );
        assert_eq!(route(&Method::GET, "models"), Some(Route::OpenAi));
        assert_eq!(route(&Method::POST, "v1/messages"), Some(Route::Anthropic));
        for (m, p) in [
            (Method::GET, "chat/completions"),
            (Method::POST, "files"),
            (Method::DELETE, "models"),
            (Method::POST, "../admin"),
            (Method::POST, ""),
            (Method::POST, "chat/completions/../../x"),
        ] {
            assert_eq!(route(&m, p), None, "{m} {p}");
        }
    }

    #[test]
    fn the_key_is_read_from_bearer_or_x_api_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), (None, false));
        h.insert("x-api-key", HeaderValue::from_static("cap-x"));
        assert_eq!(presented(&h), (Some("cap-x"), true));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer cap-b"),
        );
        assert_eq!(presented(&h), (Some("cap-b"), false));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(presented(&h), (None, false));
    }

    #[test]
    fn refusals_speak_each_clients_error_shape_and_stop_its_retries() {
        let r = refusal(
            Some(Route::Anthropic),
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "no",
        );
        assert_eq!(r.headers()["x-should-retry"], "false");
        let r = refusal(
            Some(Route::OpenAi),
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "busy",
        );
        assert_eq!(r.headers()["x-should-retry"], "true");
        assert_eq!(r.status(), 503);
    }
}
