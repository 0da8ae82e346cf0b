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

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Response};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

mod idle;
mod peer;
mod trust;

pub use peer::{hello_answer, Peers};
pub use trust::{body_digest, forwarded, is_forwarded, signed_mark, At, Forwarded, Seen, Trust};

/// What an instance keeps of forwarding for as long as it serves: the peers proven to share the
/// cluster secret, the signed forwards taken lately (each counts once), and the TLS client of
/// forwards to `https://` holders (made at the first).
#[derive(Default)]
pub struct Forwarding {
    pub peers: Peers,
    pub seen: Seen,
    tls: std::sync::OnceLock<Option<Arc<rustls::ClientConfig>>>,
}

impl Forwarding {
    /// The TLS client of forwards to `https://` holders: trusting `cluster_ca`, else the system's
    /// and Mozilla's roots (`None` when `cluster_ca` cannot be read: logged).
    pub fn tls(&self, cluster_ca: Option<&std::path::Path>) -> Option<Arc<rustls::ClientConfig>> {
        self.tls
            .get_or_init(|| {
                tls::client(cluster_ca, "--cluster-ca")
                    .inspect_err(|e| tracing::error!(error = %e, "no TLS client for forwards"))
                    .ok()
            })
            .clone()
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

/// Who forwards: this instance's id, the caller as authenticated here, the mark, and the TLS
/// client for holders advertised with `https://`.
pub struct Hop<'a> {
    pub me: &'a str,
    pub caller: &'a Caller,
    pub mark: Mark<'a>,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Where a request goes: an advertised URL's parts.
pub(super) struct Dest {
    authority: String,
    host: String,
    port: u16,
    base_path: String,
    /// `https://`: the TLS client that checks the holder's certificate.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl Dest {
    fn parse(base: &str, client: Option<Arc<rustls::ClientConfig>>) -> Result<Dest, Unreachable> {
        let bad = || Unreachable(format!("invalid holder URL {base:?}"));
        let uri: hyper::Uri = base.parse().map_err(|_| bad())?;
        let authority = uri.authority().ok_or_else(bad)?.clone();
        let tls = match uri.scheme_str() {
            Some("https") => Some(client.ok_or_else(|| {
                Unreachable("no TLS client for an https holder (see --cluster-ca)".into())
            })?),
            _ => None,
        };
        let default_port = if tls.is_some() { 443 } else { 80 };
        Ok(Dest {
            tls,
            authority: authority.as_str().to_owned(),
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(default_port),
            base_path: uri.path().trim_end_matches('/').to_owned(),
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
    let dest = Dest::parse(&holder.url, hop.tls.clone())?;
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

/// One request to `dest` on a connection of its own; its answer's head within the timeouts.
pub(super) async fn send(
    dest: &Dest,
    method: Method,
    target: &str,
    headers: Vec<(&str, HeaderValue)>,
    body: Bytes,
) -> Result<Response<hyper::body::Incoming>, Unreachable> {
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((dest.host.as_str(), dest.port)),
    )
    .await
    .map_err(|_| Unreachable("connect timed out".into()))?
    .map_err(|e| Unreachable(format!("connect: {e}")))?;
    let _ = tcp.set_nodelay(true);
    let mut req = Request::builder()
        .method(method)
        .uri(target)
        .header(header::HOST, dest.authority.as_str());
    for (name, v) in headers {
        req = req.header(name, v);
    }
    let req = req
        .body(Full::new(body))
        .map_err(|e| Unreachable(format!("request: {e}")))?;
    match &dest.tls {
        None => exchange(tcp, req).await,
        Some(client) => {
            let name = rustls::pki_types::ServerName::try_from(dest.host.clone())
                .map_err(|e| Unreachable(format!("holder name: {e}")))?;
            let connect = tokio_rustls::TlsConnector::from(client.clone()).connect(name, tcp);
            let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
                .await
                .map_err(|_| Unreachable("TLS handshake timed out".into()))?
                .map_err(|e| Unreachable(format!("TLS: {e}")))?;
            exchange(stream, req).await
        }
    }
}

/// One request and its answer's head over `io`.
async fn exchange<IO>(
    io: IO,
    req: Request<Full<Bytes>>,
) -> Result<Response<hyper::body::Incoming>, Unreachable>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| Unreachable(format!("handshake: {e}")))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    tokio::time::timeout(HEAD_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| Unreachable("no answer in time".into()))?
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
