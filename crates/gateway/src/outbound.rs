//! The gateway's own HTTP requests: forwards to the instance that holds a thread, an identity
//! provider's key set, trace exports. One client type, [`Outbound`]: hyper's pooled client, so
//! that requests to a host reuse a kept-alive connection rather than a TCP (and TLS) handshake
//! each.
//!
//! The connector is the gateway's own: TCP within the connect timeout, then for `https://` a
//! rustls handshake within it again, checked against the client's trust roots (read at the first
//! `https://` connection). [`Outbound::public`] reaches an `https://` host through the `http://`
//! proxy `HTTPS_PROXY` or `ALL_PROXY` names (`CONNECT`), unless `NO_PROXY` names the host;
//! `http://` goes straight, as do forwards. Only a connection whose answer was read to its end
//! goes back to the pool: an answer dropped half-read (a relayed stream its client left) closes
//! its connection.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::{Intercept, Matcher};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::config::EnvFn;

/// An idle connection is closed after this: sooner than a gateway closes an idle kept-alive
/// connection (`server::HEAD_TIMEOUT`, 30 s), so that none is reused just as its peer closes it.
const POOL_IDLE: Duration = Duration::from_secs(20);
/// After a burst of concurrent requests, a few warm connections per host, not one per request
/// (each also holds a descriptor at the peer, a holder's listener among them).
const POOL_IDLE_PER_HOST: usize = 8;
/// The connect timeout of [`Outbound::public`] (what the key set's client had).
const PUBLIC_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes of a proxy's answer to `CONNECT`.
const PROXY_HEAD_MAX: usize = 8192;

/// A pooled HTTP/1.1 client (clones share the pool).
#[derive(Clone)]
pub struct Outbound {
    client: Client<Connector, Full<Bytes>>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound").finish_non_exhaustive()
    }
}

/// How an [`Outbound`] connects.
pub(crate) struct Setup {
    /// The roots `https://` hosts are checked against: a PEM file and the option that names it
    /// (for errors), else the system's and Mozilla's.
    pub ca: Option<(PathBuf, &'static str)>,
    /// For TCP, and again for the TLS handshake.
    pub connect_timeout: Duration,
    /// The proxy of `https://` hosts (`None`: straight).
    pub proxy: Option<Matcher>,
}

/// Why a request got no answer: the connector's own words (`connect timed out`, `TLS: …`), else
/// hyper's with their cause.
#[derive(Debug, Clone)]
pub struct Failed(pub String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

impl From<&str> for Failed {
    fn from(s: &str) -> Failed {
        Failed(s.to_owned())
    }
}

impl Failed {
    fn of(e: &hyper_util::client::legacy::Error) -> Failed {
        use std::error::Error as _;
        let mut words = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            if let Some(ours) = c.downcast_ref::<Failed>() {
                return ours.clone();
            }
            words = format!("{words}: {c}");
            cause = c.source();
        }
        Failed(words)
    }
}

impl Outbound {
    pub(crate) fn new(setup: Setup) -> Outbound {
        let connector = Connector {
            trust: Arc::new(Trust {
                ca: setup.ca,
                config: OnceLock::new(),
            }),
            timeout: setup.connect_timeout,
            proxy: setup.proxy.map(Arc::new),
        };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(POOL_IDLE_PER_HOST)
            .pool_timer(TokioTimer::new())
            .build(connector);
        Outbound { client }
    }

    /// The client of requests that leave the cluster (an identity provider's key set, trace
    /// exports): the system's and Mozilla's roots, the proxy `env` names.
    pub fn public(env: EnvFn<'_>) -> Outbound {
        Outbound::new(Setup {
            ca: None,
            connect_timeout: PUBLIC_CONNECT_TIMEOUT,
            proxy: Some(env_proxy(env)),
        })
    }

    /// The client of the LLM egress's upstream: the roots of `ca` (else the system's and
    /// Mozilla's), the proxy `env` names for `https://`, `connect_timeout` for TCP and TLS.
    pub fn upstream(ca: Option<PathBuf>, connect_timeout: Duration, env: EnvFn<'_>) -> Outbound {
        Outbound::new(Setup {
            ca: ca.map(|p| (p, "--llm-upstream-ca")),
            connect_timeout,
            proxy: Some(env_proxy(env)),
        })
    }

    /// Sends `req` (an absolute URI; `Host` is set from it) and answers with its answer's head;
    /// the body streams as it comes.
    pub async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, Failed> {
        self.client.request(req).await.map_err(|e| Failed::of(&e))
    }
}

/// The proxy of `https://` hosts the environment names: `HTTPS_PROXY`, else `ALL_PROXY`, but
/// not for the hosts of `NO_PROXY` (each in either case, the upper one first).
fn env_proxy(env: EnvFn<'_>) -> Matcher {
    let first = |names: [&str; 2]| names.into_iter().find_map(env).unwrap_or_default();
    Matcher::builder()
        .https(first(["HTTPS_PROXY", "https_proxy"]))
        .all(first(["ALL_PROXY", "all_proxy"]))
        .no(first(["NO_PROXY", "no_proxy"]))
        .build()
}

/// The TLS client of `https://` hosts, made at the first.
struct Trust {
    ca: Option<(PathBuf, &'static str)>,
    config: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl Trust {
    fn config(&self) -> Result<Arc<rustls::ClientConfig>, Failed> {
        self.config
            .get_or_init(|| {
                let (ca, what) = match &self.ca {
                    Some((path, what)) => (Some(path.as_path()), *what),
                    None => (None, "CA file"),
                };
                tls::client(ca, what)
                    .inspect_err(|e| tracing::error!(error = %e, "no TLS client for https"))
            })
            .clone()
            .map_err(|e| Failed(format!("no TLS client ({e})")))
    }
}

type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

#[derive(Clone)]
struct Connector {
    trust: Arc<Trust>,
    timeout: Duration,
    proxy: Option<Arc<Matcher>>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = Stream;
    type Error = Failed;
    type Future = Pin<Box<dyn Future<Output = Result<Stream, Failed>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Failed>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        Box::pin(self.clone().connect(dst))
    }
}

impl Connector {
    async fn connect(self, dst: Uri) -> Result<Stream, Failed> {
        let https = match dst.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("not an http(s) URL".into()),
        };
        let host = dst.host().ok_or(Failed::from("no host in the URL"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = dst.port_u16().unwrap_or(if https { 443 } else { 80 });
        if !https {
            return Ok(MaybeHttpsStream::Http(TokioIo::new(
                tcp(host, port, self.timeout).await?,
            )));
        }
        let config = self.trust.config()?;
        let tcp = match self.proxy.as_ref().and_then(|m| m.intercept(&dst)) {
            None => tcp(host, port, self.timeout).await?,
            Some(proxy) => tunnel(&proxy, host, port, self.timeout).await?,
        };
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| Failed(format!("server name: {e}")))?;
        let handshake =
            tokio_rustls::TlsConnector::from(config).connect(name, TokioIo::new(TokioIo::new(tcp)));
        let stream = tokio::time::timeout(self.timeout, handshake)
            .await
            .map_err(|_| Failed::from("TLS handshake timed out"))?
            .map_err(|e| Failed(format!("TLS: {e}")))?;
        Ok(MaybeHttpsStream::Https(TokioIo::new(stream)))
    }
}

async fn tcp(host: &str, port: u16, limit: Duration) -> Result<TcpStream, Failed> {
    let tcp = tokio::time::timeout(limit, TcpStream::connect((host, port)))
        .await
        .map_err(|_| Failed::from("connect timed out"))?
        .map_err(|e| Failed(format!("connect: {e}")))?;
    // Small writes (a relayed event) leave at once.
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// A TCP connection to `host:port` through `proxy`'s `CONNECT`.
async fn tunnel(
    proxy: &Intercept,
    host: &str,
    port: u16,
    limit: Duration,
) -> Result<TcpStream, Failed> {
    let at = proxy.uri();
    if at.scheme_str() != Some("http") {
        return Err("the proxy is not an http:// URL (the only kind supported)".into());
    }
    let proxy_host = at.host().ok_or(Failed::from("the proxy URL has no host"))?;
    let proxy_host = proxy_host.trim_start_matches('[').trim_end_matches(']');
    let mut tcp = tcp(proxy_host, at.port_u16().unwrap_or(80), limit)
        .await
        .map_err(|e| Failed(format!("proxy {e}")))?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(auth) = proxy.basic_auth().and_then(|v| v.to_str().ok()) {
        head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    head.push_str("\r\n");
    let answer = async {
        tcp.write_all(head.as_bytes()).await?;
        // The answer's head only: the proxy sends nothing more before the TLS handshake starts.
        let mut got = Vec::new();
        let mut chunk = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            if got.len() > PROXY_HEAD_MAX {
                return Err(std::io::Error::other("its answer is too long"));
            }
            let n = tcp.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::other("it closed the connection"));
            }
            got.extend_from_slice(&chunk[..n]);
        }
        Ok(got)
    };
    let answer = tokio::time::timeout(limit, answer)
        .await
        .map_err(|_| Failed::from("proxy CONNECT timed out"))?
        .map_err(|e| Failed(format!("proxy CONNECT: {e}")))?;
    let line = answer.split(|b| *b == b'\r').next().unwrap_or_default();
    if line.split(|b| *b == b' ').nth(1) != Some(b"200") {
        let line = String::from_utf8_lossy(line);
        return Err(Failed(format!("proxy CONNECT refused: {line}")));
    }
    Ok(tcp)
}

#[cfg(test)]
pub(crate) mod tests;
