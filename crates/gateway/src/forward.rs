//! Forwarding a request to the instance that holds its thread (with a shared store), and
//! relaying the answer: status, headers and body, an event stream as it comes.
//!
//! The forwarded request carries what the holder needs to judge it as if the client had sent it
//! there (content type, language, `Last-Event-ID`, trace context, the client's credentials) and a
//! mark that it was forwarded, with the cluster's forward key (kept in the shared database, so a
//! client cannot know it) and the forwarding instance's decision of who the caller is. The
//! holder takes that decision as it is: the caller is authenticated once, by the instance the
//! client reached, and a client cannot forge it (a mark without the key is no mark; a user
//! header without the service token is refused before any forward). A forwarded request is
//! never forwarded again, so two instances that disagree about a thread's holder answer 503
//! instead of passing it back and forth. A client that goes away drops the relay, and the
//! holder sees its client go.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use subtle::ConstantTimeEq;

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;

use crate::auth::{Caller, Via};

/// The mark of a forwarded request (its value: the forwarding instance's id).
pub const FORWARDED: &str = "x-iac-code-agui-forwarded-by";
/// The cluster's forward key, which makes the mark count.
pub const FORWARD_KEY: &str = "x-iac-code-agui-forward-key";
/// The caller as the forwarding instance authenticated it: `open`, `service` or `jwt`, and with
/// a user `:` and the user in base64url (any bytes of a bounded id survive a header).
pub const CALLER: &str = "x-iac-code-agui-caller";

/// Connecting to the holder and getting its answer's head.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Request headers passed on (the credentials too: the holder does not need them, but an
/// instance of the version before it, during a rolling upgrade, does).
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

/// The caller of a request another instance of the cluster forwarded (its mark carries the
/// cluster's `key`); `None` for any other request, a client's forged mark included.
pub fn forwarded_caller(headers: &HeaderMap, key: Option<&str>) -> Option<Caller> {
    let key = key?;
    headers.get(FORWARDED)?;
    let given = headers.get(FORWARD_KEY)?;
    if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
        return None;
    }
    decode_caller(headers.get(CALLER)?.to_str().ok()?)
}

/// Whether `headers` are those of a request another instance forwarded.
pub fn is_forwarded(headers: &HeaderMap, key: Option<&str>) -> bool {
    forwarded_caller(headers, key).is_some()
}

fn encode_caller(c: &Caller) -> String {
    let via = match c.via {
        Via::Open => "open",
        Via::Service => "service",
        Via::Jwt => "jwt",
    };
    match &c.user {
        None => via.to_owned(),
        Some(u) => format!("{via}:{}", B64.encode(u.as_bytes())),
    }
}

fn decode_caller(v: &str) -> Option<Caller> {
    let (via, user) = match v.split_once(':') {
        None => (v, None),
        Some((via, u)) => {
            let bytes = B64.decode(u).ok()?;
            let user = String::from_utf8(bytes).ok()?;
            (
                via,
                Some(user).filter(|u| crate::validate::is_bounded(u) && !u.is_empty()),
            )
        }
    };
    let via = match via {
        "open" => Via::Open,
        "service" => Via::Service,
        "jwt" => Via::Jwt,
        _ => return None,
    };
    if v.contains(':') && user.is_none() {
        return None;
    }
    Some(Caller { via, user })
}

/// Who forwards: this instance's id, the cluster's forward key, and the caller as authenticated
/// here.
pub struct Hop<'a> {
    pub me: &'a str,
    pub key: &'a str,
    pub caller: &'a Caller,
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
    hop: &Hop<'_>,
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
        .header(FORWARDED, hop.me)
        .header(FORWARD_KEY, hop.key)
        .header(CALLER, encode_caller(hop.caller));
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

    fn marked(key: &str, caller: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(FORWARDED, "instance-a".parse().unwrap());
        h.insert(FORWARD_KEY, key.parse().unwrap());
        h.insert(CALLER, caller.parse().unwrap());
        h
    }

    /// Only a mark with the cluster's key counts, and it carries the caller exactly.
    #[test]
    fn a_forward_carries_the_caller_only_with_the_clusters_key() {
        for c in [
            Caller::OPEN,
            Caller {
                via: Via::Service,
                user: None,
            },
            Caller {
                via: Via::Service,
                user: Some("ünïcode user".into()),
            },
            Caller {
                via: Via::Jwt,
                user: Some("alice".into()),
            },
        ] {
            let h = marked("k3y", &encode_caller(&c));
            assert_eq!(forwarded_caller(&h, Some("k3y")), Some(c.clone()));
            assert!(is_forwarded(&h, Some("k3y")));
            // A forged mark: no key, another key, or no shared store (no key at all).
            assert_eq!(forwarded_caller(&h, Some("other")), None);
            assert_eq!(forwarded_caller(&h, None), None);
            let mut no_key = h.clone();
            no_key.remove(FORWARD_KEY);
            assert!(!is_forwarded(&no_key, Some("k3y")));
        }
        for bad in ["root", "jwt:", "jwt:!!", "service:AAE", "", "open:YQ:x"] {
            let h = marked("k3y", bad);
            assert_eq!(forwarded_caller(&h, Some("k3y")), None, "{bad:?}");
        }
    }

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
