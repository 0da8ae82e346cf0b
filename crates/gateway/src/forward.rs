//! Forwarding a request to the instance that holds its thread (with a shared store), and
//! relaying the answer: status, headers and body, an event stream as it comes.
//!
//! The forwarded request carries what the holder needs to judge it as if the client had sent it
//! there (the token, content type, language, `Last-Event-ID`, trace context) and a mark that it
//! was forwarded: a forwarded request is never forwarded again, so two instances that disagree
//! about a thread's holder answer 503 instead of passing it back and forth. A client that goes
//! away drops the relay, and the holder sees its client go.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

/// The mark of a forwarded request (its value: the forwarding instance's id).
pub const FORWARDED: &str = "x-iac-code-agui-forwarded-by";

/// Connecting to the holder and getting its answer's head.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Request headers passed on: the holder authenticates the request itself, from the same
/// credentials (a JWT it verifies, or the service token with the user it names), so no header a
/// client could forge decides who it is there either.
const PASSED: [&str; 9] = [
    "authorization",
    crate::auth::USER_HEADER,
    "content-type",
    "accept",
    "accept-language",
    "last-event-id",
    "traceparent",
    "tracestate",
    "user-agent",
];

/// Whether `headers` are those of a forwarded request.
pub fn is_forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED)
}

/// Why the holder could not be asked.
#[derive(Debug)]
pub struct Unreachable(pub String);

/// Answer headers kept: all but those of one connection, and CORS (the instance the client
/// talks to adds its own).
fn kept(name: &HeaderName) -> bool {
    let n = name.as_str();
    !matches!(
        n,
        "connection" | "keep-alive" | "transfer-encoding" | "te" | "trailer" | "upgrade" | "vary"
    ) && !n.starts_with("proxy-")
        && !n.starts_with("access-control-")
}

/// Sends the request to the holder at `base` (its advertise URL) and answers with its answer.
pub async fn forward(
    base: &str,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Bytes,
    me: &str,
) -> Result<Response<Body>, Unreachable> {
    let uri: hyper::Uri = base
        .parse()
        .map_err(|_| Unreachable(format!("invalid holder URL {base:?}")))?;
    let authority = uri
        .authority()
        .ok_or_else(|| Unreachable(format!("invalid holder URL {base:?}")))?
        .clone();
    let port = authority.port_u16().unwrap_or(80);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let base_path = uri.path().trim_end_matches('/');
    let target = format!("{base_path}{path_and_query}");
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .map_err(|_| Unreachable("connect timed out".into()))?
    .map_err(|e| Unreachable(format!("connect: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let mut req = Request::builder()
        .method(method)
        .uri(target)
        .header(header::HOST, authority.as_str())
        .header(FORWARDED, me);
    for name in PASSED {
        for v in headers.get_all(name) {
            req = req.header(name, v);
        }
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| Unreachable(format!("request: {e}")))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| Unreachable(format!("handshake: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let resp = tokio::time::timeout(HEAD_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| Unreachable("no answer in time".into()))?
        .map_err(|e| Unreachable(format!("answer: {e}")))?;
    let (parts, incoming) = resp.into_parts();
    let mut out = Response::builder().status(parts.status);
    for (name, value) in parts.headers.iter().filter(|(n, _)| kept(n)) {
        out = out.header(name, value);
    }
    out.body(Body::new(incoming))
        .map_err(|e| Unreachable(format!("answer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_and_cors_headers_are_not_relayed() {
        for (name, keep) in [
            ("content-type", true),
            ("cache-control", true),
            ("x-accel-buffering", true),
            ("connection", false),
            ("transfer-encoding", false),
            ("access-control-allow-origin", false),
            ("vary", false),
            ("proxy-authenticate", false),
        ] {
            assert_eq!(kept(&HeaderName::from_static(name)), keep, "{name}");
        }
    }
}
