//! Forwarding a request to the instance that holds its thread (with a shared store), and
//! relaying the answer: status, headers and body, an event stream as it comes.
//!
//! The forwarded request carries what the holder needs to judge it as if the client had sent it
//! there (content type, language, `Last-Event-ID`, trace context, the client's credentials) and a
//! mark that it was forwarded, with the forwarding instance's decision of who the caller is
//! (`trust`: signed with the cluster secret, or the database's forward key without one). The
//! holder takes that decision as it is: the caller is authenticated once, by the instance the
//! client reached, and a client cannot forge it (a mark that does not verify is no mark; a user
//! header without the service token is refused before any forward). With a cluster secret the
//! target proves it knows the secret before it is sent anything (`peer`). A forwarded request is
//! never forwarded again, so two instances that disagree about a thread's holder answer 503
//! instead of passing it back and forth. A client that goes away drops the relay, and the
//! holder sees its client go; a holder that falls silent ends the relay (`idle`).

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;

use crate::outbound::{Outbound, Setup};

mod idle;
mod peer;
mod trust;

pub use peer::{hello_answer, Peers};
pub use trust::{body_digest, forwarded, is_forwarded, signed_mark, At, Forwarded, Seen, Trust};

/// What an instance keeps of forwarding for as long as it serves: the peers proven to share the
/// cluster secret, the signed forwards taken lately (each counts once), and the one client of
/// all forwards, whose pool keeps connections to the holders open between forwards.
pub struct Forwarding {
    pub peers: Peers,
    pub seen: Seen,
    pub client: Outbound,
}

impl Forwarding {
    /// `https://` holders are checked against `cluster_ca`, else the system's and Mozilla's roots
    /// (read at the first: a `cluster_ca` that cannot be read is logged then, and every forward
    /// to an `https://` holder fails).
    pub fn new(cluster_ca: Option<PathBuf>) -> Forwarding {
        Forwarding {
            peers: Peers::default(),
            seen: Seen::default(),
            client: Outbound::new(Setup {
                ca: cluster_ca.map(|p| (p, "--cluster-ca")),
                connect_timeout: CONNECT_TIMEOUT,
                // The cluster's hosts are reached straight.
                proxy: None,
            }),
        }
    }
}

use crate::auth::Caller;
use store::Peer;

/// The mark of a forwarded request (its value: the forwarding instance's id).
pub const FORWARDED: &str = "x-iac-code-agui-forwarded-by";

/// Connecting to the holder and getting its answer's head.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Request headers passed on. Not the client's credentials: the holder takes the caller the mark
/// carries, so a client's token never crosses to another instance.
const PASSED: [&str; 7] = [
    "content-type",
    "accept",
    "accept-language",
    "last-event-id",
    "traceparent",
    "tracestate",
    "user-agent",
];

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

/// How this instance marks what it forwards.
pub enum Mark<'a> {
    /// Signed with the cluster secret, once the target proved it knows it too.
    Signed { secret: &'a [u8], peers: &'a Peers },
    /// The database's forward key.
    Key(&'a str),
}

/// Who forwards: this instance's id, the caller as authenticated here, the mark, and the client
/// of forwards ([`Forwarding::client`]).
pub struct Hop<'a> {
    pub me: &'a str,
    pub caller: &'a Caller,
    pub mark: Mark<'a>,
    pub client: &'a Outbound,
}

/// Where a request goes: an advertised URL's parts.
pub(super) struct Dest<'a> {
    /// `http://host:port` or `https://…`.
    origin: String,
    base_path: String,
    client: &'a Outbound,
}

impl Dest<'_> {
    fn parse<'a>(base: &str, client: &'a Outbound) -> Result<Dest<'a>, Unreachable> {
        let bad = || Unreachable(format!("invalid holder URL {base:?}"));
        let uri: hyper::Uri = base.parse().map_err(|_| bad())?;
        let authority = uri.authority().ok_or_else(bad)?;
        let scheme = match uri.scheme_str() {
            Some("https") => "https",
            _ => "http",
        };
        Ok(Dest {
            origin: format!("{scheme}://{authority}"),
            base_path: uri.path().trim_end_matches('/').to_owned(),
            client,
        })
    }
}

/// Sends the request to `holder` (at its advertise URL) and answers with its answer.
pub async fn forward(
    holder: &Peer,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Bytes,
    hop: &Hop<'_>,
) -> Result<Response<Body>, Unreachable> {
    let dest = Dest::parse(&holder.url, hop.client)?;
    let target = format!("{}{path_and_query}", dest.base_path);
    let caller = trust::encode_caller(hop.caller);
    let me = HeaderValue::from_str(hop.me).map_err(|_| Unreachable("bad instance id".into()))?;
    let mut extra: Vec<(&str, HeaderValue)> = vec![(FORWARDED, me)];
    match &hop.mark {
        Mark::Signed { secret, peers } => {
            let to = peers.prove(holder, &dest, secret).await?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let (from, caller) = (hop.me, hop.caller);
            let at = trust::At {
                from,
                to: &to,
                time: now,
            };
            extra.extend(trust::signed_mark(
                secret, &method, &target, &body, at, caller,
            ));
        }
        Mark::Key(key) => {
            let v = |s: &str| HeaderValue::from_str(s).map_err(|_| Unreachable("bad mark".into()));
            extra.push((trust::FORWARD_KEY, v(key)?));
            extra.push((trust::CALLER, v(&caller)?));
        }
    }
    for name in PASSED {
        for v in headers.get_all(name) {
            extra.push((name, v.clone()));
        }
    }
    let resp = send(&dest, method, &target, extra, body).await?;
    let (parts, incoming) = resp.into_parts();
    let mut out = Response::builder().status(parts.status);
    for (name, value) in parts.headers.iter().filter(|(n, _)| kept(n)) {
        out = out.header(name, value);
    }
    out.body(Body::new(idle::Idle::new(incoming, idle::RELAY_IDLE)))
        .map_err(|e| Unreachable(format!("answer: {e}")))
}

/// One request to `dest`, on a connection of the pool's or a new one (within [`CONNECT_TIMEOUT`]
/// for TCP and again for TLS); its answer's head within [`HEAD_TIMEOUT`], connecting included.
pub(super) async fn send(
    dest: &Dest<'_>,
    method: Method,
    target: &str,
    headers: Vec<(&str, HeaderValue)>,
    body: Bytes,
) -> Result<Response<hyper::body::Incoming>, Unreachable> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("{}{target}", dest.origin));
    for (name, v) in headers {
        req = req.header(name, v);
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| Unreachable(format!("request: {e}")))?;
    tokio::time::timeout(HEAD_TIMEOUT, dest.client.send(req))
        .await
        .map_err(|_| Unreachable("no answer in time".into()))?
        .map_err(|e| Unreachable(e.0))
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

    /// Forwards to a holder share one connection; a relayed stream its client left closes its
    /// own connection and nothing else.
    #[tokio::test]
    async fn forwards_to_a_holder_reuse_one_connection() {
        use http_body_util::BodyExt as _;
        let holder = crate::outbound::tests::Server::start(None).await;
        let forwarding = Forwarding::new(None);
        let peer = Peer {
            url: format!("{}/", holder.url),
            id: "holder".into(),
        };
        let hop = Hop {
            me: "me",
            caller: &Caller::OPEN,
            mark: Mark::Key("k"),
            client: &forwarding.client,
        };
        let go = |path: &'static str| {
            let (peer, hop) = (&peer, &hop);
            async move {
                let headers = HeaderMap::new();
                forward(peer, Method::GET, path, &headers, Bytes::new(), hop)
                    .await
                    .unwrap()
                    .into_body()
            }
        };
        for path in ["/threads/t1", "/threads/t2"] {
            let body = go(path).await.collect().await.unwrap().to_bytes();
            assert_eq!(body, format!("GET {path}"));
        }
        assert_eq!(holder.accepted(), 1);
        let mut stream = go("/stream").await;
        let first = stream.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"first");
        drop(stream);
        // The holder sees its client go.
        holder.until_closed(1).await;
        for _ in 0..2 {
            let body = go("/threads/t1").await.collect().await.unwrap().to_bytes();
            assert_eq!(body, "GET /threads/t1");
        }
        assert_eq!(holder.accepted(), 2);
    }
}
