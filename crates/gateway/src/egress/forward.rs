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

use super::body::{route, Route};
use super::grants::{Account, Spend};
use super::usage::{Reported, Scan, Tokens};
use super::Inner;

/// The most bytes of a request body (a conversation with its tool results and images).
pub const MAX_BODY: usize = 32 * 1024 * 1024;
/// A request body must arrive whole within this (from a kernel on this machine).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
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

/// The key a request presents: `Authorization: Bearer` (both SDKs iac-code uses), else
/// `x-api-key` or `api-key`; and how (the upstream gets the key the same way).
fn presented(headers: &HeaderMap) -> (Option<&str>, KeyHeader) {
    if let Some(b) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
    {
        return (Some(b.trim()), KeyHeader::Bearer);
    }
    for (name, how) in [
        ("x-api-key", KeyHeader::XApiKey),
        ("api-key", KeyHeader::ApiKey),
    ] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            return (Some(v.trim()), how);
        }
    }
    (None, KeyHeader::Bearer)
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
    // A refused connection is not kept: holding connections open costs a refused caller more.
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// How the key goes upstream: as the kernel presented its capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyHeader {
    Bearer,
    XApiKey,
    ApiKey,
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
    let refuse = |outcome: &'static str, status, code, message| {
        inner.metrics.llm_request(outcome, started.elapsed());
        refusal(Some(route), status, code, message)
    };
    let (key, how) = presented(&parts.headers);
    let spend = match inner.admit(kernel, key) {
        Ok(s) => s,
        Err(why) => {
            inner.say_denied(why);
            return refuse(
                "denied",
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "The LLM egress did not accept this request's capability.",
            );
        }
    };
    // With a budget, what spends is counted to a user: a shared kernel's own capability (no
    // user's) may only list the models.
    if inner.budgeted && spend.account.is_none() && parts.method == http::Method::POST {
        return refuse(
            "budget",
            StatusCode::FORBIDDEN,
            "permission_error",
            "With a token budget, shared kernels spend only through a run's capability.",
        );
    }
    if let Some(wait) = spend.account.as_deref().and_then(|a| inner.exhausted(a)) {
        return budget_spent(&inner, &spend, route, wait, started);
    }
    // A place of the account's (its share of requests and of bodies held) before the body is
    // read: a slow or large body holds only its own user's share.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return too_large(&inner, route, started);
    }
    let expected = match (&parts.method, declared) {
        (&http::Method::GET, _) => declared.unwrap_or(0),
        (_, n) => n.unwrap_or(MAX_BODY),
    };
    let mut place = match inner
        .shares
        .enter(&spend.account, expected, QUEUE_WAIT)
        .await
    {
        Ok(p) => p,
        Err(_) => {
            return refuse(
                "busy",
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "This user has as many LLM requests at the egress as they may at once.",
            )
        }
    };
    let body =
        match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return too_large(&inner, route, started),
            Err(_) => {
                return refuse(
                    "invalid",
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    "The request body did not arrive in time.",
                )
            }
        };
    let spends = parts.method == http::Method::POST;
    let sent_bytes = body.len() as u64;
    let (body, reserve) = if spends {
        let given = body.clone();
        let prepared =
            tokio::task::spawn_blocking(move || super::body::prepare(route, &given)).await;
        match prepared {
            Ok(p) => (p.body.map(Bytes::from).unwrap_or(body), p.reserve),
            Err(_) => (body, 0),
        }
    } else {
        // The list of models spends nothing.
        (body, 0)
    };
    // Reserved against the budget until the answer ends; a user already past it is refused.
    let reserved = match &spend.account {
        Some(account) => match inner.reserve(account, reserve) {
            Ok(()) => reserve,
            Err(wait) => return budget_spent(&inner, &spend, route, wait, started),
        },
        None => 0,
    };
    let mut settle = Settle {
        inner: inner.clone(),
        account: spend.account.clone(),
        reserved,
        sent_bytes,
        spends,
        sent: false,
        started,
        done: false,
    };
    let upstream = match upstream_request(&inner, &parts, rest, body, &spend, how) {
        Ok(r) => r,
        Err(e) => {
            settle.nothing();
            return refuse(
                "invalid",
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                e,
            );
        }
    };
    let permit = match tokio::time::timeout(QUEUE_WAIT, inner.permits.clone().acquire_owned()).await
    {
        Ok(Ok(p)) => p,
        _ => {
            settle.nothing();
            return refuse(
                "busy",
                StatusCode::SERVICE_UNAVAILABLE,
                "overloaded_error",
                "The LLM egress has as many requests as it may forward at once.",
            );
        }
    };
    settle.sent = true;
    let answer = tokio::time::timeout(HEAD_TIMEOUT, inner.client.send(upstream)).await;
    place.body_sent();
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the LLM upstream could not be reached");
            settle.nothing();
            return refuse(
                "failed",
                StatusCode::BAD_GATEWAY,
                "api_error",
                "The LLM upstream could not be reached.",
            );
        }
        Err(_) => {
            settle.nothing();
            return refuse(
                "failed",
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
        received: 0,
        idle: Box::pin(tokio::time::sleep(IDLE_TIMEOUT)),
        end: Some(End {
            settle,
            started,
            status: head.status,
            _permit: permit,
            _place: place,
        }),
    };
    Response::from_parts(head, Body::new(relay))
}

/// 429: the user's budget is spent (the run marked, so that its end says so).
fn budget_spent(
    inner: &Inner,
    spend: &Spend,
    route: Route,
    wait: Duration,
    started: Instant,
) -> Response<Body> {
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
    r
}

fn too_large(inner: &Inner, route: Route, started: Instant) -> Response<Body> {
    inner.metrics.llm_request("invalid", started.elapsed());
    refusal(
        Some(route),
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        "The request body is larger than the LLM egress takes (32 MiB).",
    )
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
/// headers that iac-code's clients send (`body::kernel_header_passes`), the key (the run's,
/// else the operator's) as the kernel presented its capability, then the run's headers; the
/// answer uncompressed, so that its usage can be read.
fn upstream_request(
    inner: &Inner,
    parts: &http::request::Parts,
    rest: &str,
    body: Bytes,
    spend: &Spend,
    how: KeyHeader,
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
        if super::body::kernel_header_passes(name.as_str()) {
            h.append(name.clone(), value.clone());
        }
    }
    h.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    // A run's own credential header stands in for any key; with the operator's key, a run's
    // headers are only those the kernel's clients send (none to bill another organisation).
    let own_credential = spend
        .headers
        .iter()
        .any(|(n, _)| matches!(n.as_str(), "authorization" | "x-api-key" | "api-key"));
    let operators = spend.key.is_none() && !own_credential;
    let key = match own_credential {
        true => None,
        false => spend.key.as_deref().or(inner.key.as_deref()),
    };
    if let Some(key) = key {
        let (name, value) = match how {
            KeyHeader::Bearer => (header::AUTHORIZATION, format!("Bearer {key}")),
            KeyHeader::XApiKey => (HeaderName::from_static("x-api-key"), key.to_owned()),
            KeyHeader::ApiKey => (HeaderName::from_static("api-key"), key.to_owned()),
        };
        let mut value =
            HeaderValue::from_str(&value).map_err(|_| "The key is not a header value.")?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    for (name, value) in &spend.headers {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| "A header name is invalid.")?;
        let passes = match operators {
            true => super::body::kernel_header_passes(name.as_str()),
            false => super::body::run_header_passes(name.as_str()),
        };
        if !passes {
            continue;
        }
        let mut value = HeaderValue::from_str(value).map_err(|_| "A header value is invalid.")?;
        value.set_sensitive(true);
        h.insert(name, value);
    }
    Ok(req)
}

/// What a request reserved of its user's budget, settled once with what it spent: when its
/// answer ends, when the egress refuses it (nothing), or when the kernel leaves before an
/// answer (dropped: the input, if it went upstream).
struct Settle {
    inner: Arc<Inner>,
    account: Account,
    reserved: u64,
    /// The request body's size (the input's estimate when the answer reports no usage).
    sent_bytes: u64,
    /// A request that spends tokens (a POST; the list of models spends none).
    spends: bool,
    /// The request went upstream.
    sent: bool,
    started: Instant,
    done: bool,
}

impl Settle {
    /// Settles with `t` spent.
    fn record(&mut self, t: Tokens) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        self.inner.metrics.llm_tokens(t.input, t.output);
        if let Some(account) = &self.account {
            self.inner.settle(account, self.reserved, t.input, t.output);
        }
    }

    /// Refused or failed before an answer: nothing spent.
    fn nothing(mut self) {
        self.record(Tokens::default());
    }

    /// An answer of `status` ended with `reported`, after `received` bytes, `whole` or not:
    /// the final report when it was seen on a whole answer, else at least the estimate of the
    /// bytes each way (an error answer without usage spends nothing).
    fn answered(
        mut self,
        status: StatusCode,
        reported: Option<Reported>,
        received: u64,
        whole: bool,
    ) {
        let per = super::body::BYTES_PER_TOKEN;
        let estimate = Tokens {
            input: self.sent_bytes / per,
            output: received / per,
        };
        let t = match reported {
            Some(r) if r.complete && whole => r.tokens,
            Some(r) if self.spends => Tokens {
                input: r.tokens.input.max(estimate.input),
                output: r.tokens.output.max(estimate.output),
            },
            Some(r) => r.tokens,
            None if self.spends && status.is_success() => estimate,
            None => Tokens::default(),
        };
        self.record(t);
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // The kernel left before the answer came.
        self.inner
            .metrics
            .llm_request("left", self.started.elapsed());
        let per = super::body::BYTES_PER_TOKEN;
        let input = if self.sent && self.spends {
            self.sent_bytes / per
        } else {
            0
        };
        self.record(Tokens { input, output: 0 });
    }
}

/// What is counted when an answer ends.
struct End {
    settle: Settle,
    started: Instant,
    status: StatusCode,
    _permit: OwnedSemaphorePermit,
    _place: super::shares::Place,
}

/// The upstream's answer on its way to the kernel.
struct Relay {
    body: Incoming,
    scan: Option<Scan>,
    /// Bytes of the answer passed on.
    received: u64,
    idle: Pin<Box<tokio::time::Sleep>>,
    end: Option<End>,
}

/// How an answer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Whole,
    /// The upstream failed or went silent.
    Broken,
    /// The kernel left before the end.
    Left,
}

impl Relay {
    /// Counts the request once: its outcome, duration and tokens.
    fn finish(&mut self, ending: Ending) {
        let Some(end) = self.end.take() else { return };
        let tokens = self.scan.take().and_then(Scan::finish);
        let outcome = match ending {
            Ending::Broken => "failed",
            Ending::Left => "left",
            Ending::Whole if end.status.is_client_error() => "upstream_4xx",
            Ending::Whole if end.status.is_server_error() => "upstream_5xx",
            Ending::Whole => "ok",
        };
        end.settle
            .inner
            .metrics
            .llm_request(outcome, end.started.elapsed());
        let whole = ending == Ending::Whole;
        end.settle
            .answered(end.status, tokens, self.received, whole);
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
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    if let Some(scan) = this.scan.as_mut() {
                        scan.feed(data);
                    }
                }
                let next = tokio::time::Instant::now() + IDLE_TIMEOUT;
                this.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.finish(Ending::Broken);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                this.finish(Ending::Whole);
                Poll::Ready(None)
            }
            Poll::Pending => {
                if this.idle.as_mut().poll(cx).is_ready() {
                    this.finish(Ending::Broken);
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
        self.finish(Ending::Left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_read_from_bearer_or_x_api_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented(&h), (None, KeyHeader::Bearer));
        h.insert("api-key", HeaderValue::from_static("cap-a"));
        assert_eq!(presented(&h), (Some("cap-a"), KeyHeader::ApiKey));
        h.insert("x-api-key", HeaderValue::from_static("cap-x"));
        assert_eq!(presented(&h), (Some("cap-x"), KeyHeader::XApiKey));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer cap-b"),
        );
        assert_eq!(presented(&h), (Some("cap-b"), KeyHeader::Bearer));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(presented(&h), (None, KeyHeader::Bearer));
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
