//! A loopback chaos proxy between the gateway and a kernel (fake or real).
//!
//! It forwards every HTTP request to the upstream kernel and streams the answer back, unless a
//! queued [`Fault`] matches the request: then it cuts, stalls, delays, truncates, injects garbage
//! or a JSON-RPC error, or refuses the connection. [`ChaosProxy::restart`] models a kernel restart:
//! every open response is cut, connections are refused while the kernel is down, and requests go
//! to the new upstream afterwards.
//!
//! Faults act on SSE frames (a frame ends at a blank line, LF or CRLF), so `after: n` means "after
//! the n-th complete event of the real stream".

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// What to do to one matching request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Forward `after` frames of the answer, then break the connection (the body errors).
    Cut { after: usize },
    /// Forward `after` frames, then send nothing more; the connection stays open.
    Stall { after: usize },
    /// Hold every frame of the answer back by this long.
    Delay(Duration),
    /// Forward `after` frames and half of the next one, then end the body cleanly.
    Truncate { after: usize },
    /// Forward `after` frames, then end the body cleanly at that frame boundary.
    End { after: usize },
    /// After `after` frames, write these raw bytes, then go on forwarding.
    Garbage { after: usize, bytes: Vec<u8> },
    /// Do not forward: answer HTTP 200 with a JSON-RPC error body.
    RpcError { code: i64, message: String },
    /// After `after` frames of the real stream, send a JSON-RPC error as an SSE `event: error`
    /// and end the stream.
    StreamRpcError {
        after: usize,
        code: i64,
        message: String,
    },
    /// Do not forward: HTTP 503 with a plain body (a proxy or kernel in trouble).
    Status(u16),
}

/// Which requests a fault applies to.
#[derive(Debug, Clone, PartialEq)]
pub enum Match {
    /// A JSON-RPC method on `POST /`.
    Method(String),
    /// A request path (`/iac-code/session/ensure-restored`, `/health`, …).
    Path(String),
    /// Any request except `/health`.
    Any,
}

impl Match {
    pub fn method(m: &str) -> Match {
        Match::Method(m.to_owned())
    }
}

/// One proxied request, as seen.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub method: Option<String>,
    pub body: Value,
    /// The fault applied to it, if any.
    pub fault: Option<Fault>,
}

struct Rule {
    matcher: Match,
    fault: Fault,
    /// Remaining uses; `None` = every matching request.
    times: Option<usize>,
}

struct Shared {
    upstream: Mutex<String>,
    rules: Mutex<VecDeque<Rule>>,
    seen: Mutex<Vec<Seen>>,
    down: AtomicBool,
    /// Bumped to cut every open response.
    generation: tokio::sync::watch::Sender<u64>,
    open: AtomicUsize,
    http: reqwest::Client,
}

/// The running proxy.
#[derive(Clone)]
pub struct ChaosProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl ChaosProxy {
    /// Starts a proxy on 127.0.0.1:0 in front of `upstream` (`http://127.0.0.1:<port>/`).
    pub async fn start(upstream: &str) -> ChaosProxy {
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            upstream: Mutex::new(upstream.trim_end_matches('/').to_owned()),
            rules: Mutex::new(VecDeque::new()),
            seen: Mutex::new(Vec::new()),
            down: AtomicBool::new(false),
            generation,
            open: AtomicUsize::new(0),
            http: reqwest::Client::builder()
                .no_proxy()
                .tcp_nodelay(true)
                .build()
                .expect("proxy client"),
        });
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind chaos proxy");
        let addr = tcp.local_addr().expect("addr");
        let listener = Refusing {
            tcp,
            shared: shared.clone(),
        };
        let app = Router::new().fallback(proxy).with_state(shared.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ChaosProxy { addr, shared }
    }

    /// `http://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Applies `fault` to the next `times` requests matching `m`.
    pub fn inject(&self, m: Match, fault: Fault, times: usize) {
        self.shared.rules.lock().expect("rules").push_back(Rule {
            matcher: m,
            fault,
            times: Some(times),
        });
    }

    /// Applies `fault` to every request matching `m` until [`ChaosProxy::clear`].
    pub fn always(&self, m: Match, fault: Fault) {
        self.shared.rules.lock().expect("rules").push_back(Rule {
            matcher: m,
            fault,
            times: None,
        });
    }

    /// Removes every queued fault.
    pub fn clear(&self) {
        self.shared.rules.lock().expect("rules").clear();
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().expect("seen").clone()
    }

    /// Requests of one JSON-RPC method.
    pub fn calls(&self, method: &str) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|s| s.method.as_deref() == Some(method))
            .collect()
    }

    /// Responses currently being streamed through the proxy.
    pub fn open_responses(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Cuts every open response now.
    pub fn cut_all(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// Kernel down: open responses are cut and new connections are refused (closed at once).
    pub fn down(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
        self.cut_all();
    }

    /// Kernel up again at `upstream` (the same or a new address).
    pub fn up(&self, upstream: &str) {
        *self.shared.upstream.lock().expect("upstream") = upstream.trim_end_matches('/').to_owned();
        self.shared.down.store(false, Ordering::SeqCst);
    }

    /// A kernel restart as the gateway sees it: [`down`](Self::down), then
    /// [`up`](Self::up) at `upstream`.
    pub fn restart(&self, upstream: &str) {
        self.down();
        self.up(upstream);
    }

    /// Waits until `method` was seen `n` times.
    pub async fn wait_calls(&self, method: &str, n: usize, timeout: Duration) -> Vec<Seen> {
        crate::wait_for(n, timeout, || self.calls(method)).await
    }
}

/// A listener that closes accepted connections at once while the kernel is "down".
struct Refusing {
    tcp: tokio::net::TcpListener,
    shared: Arc<Shared>,
}

impl axum::serve::Listener for Refusing {
    type Io = tokio::net::TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.tcp.accept().await {
                Ok((s, a)) => {
                    if self.shared.down.load(Ordering::SeqCst) {
                        // RST rather than FIN: the client sees a refused/reset connection.
                        // A zero linger never blocks on drop.
                        #[allow(deprecated)]
                        let _ = s.set_linger(Some(Duration::ZERO));
                        drop(s);
                        continue;
                    }
                    let _ = s.set_nodelay(true);
                    return (s, a);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

fn take_fault(shared: &Shared, path: &str, method: Option<&str>) -> Option<Fault> {
    let mut rules = shared.rules.lock().expect("rules");
    let idx = rules.iter().position(|r| match &r.matcher {
        Match::Method(m) => method == Some(m.as_str()),
        Match::Path(p) => p == path,
        Match::Any => path != "/health",
    })?;
    let fault = rules[idx].fault.clone();
    if let Some(t) = rules[idx].times.as_mut() {
        *t -= 1;
        if *t == 0 {
            rules.remove(idx);
        }
    }
    Some(fault)
}

const HOP: [&str; 5] = [
    "connection",
    "transfer-encoding",
    "content-length",
    "keep-alive",
    "host",
];

async fn proxy(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, 64 << 20)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    let json: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let method = if parts.method == axum::http::Method::POST && path == "/" {
        json.get("method")
            .and_then(Value::as_str)
            .map(str::to_owned)
    } else {
        None
    };
    let fault = take_fault(&shared, &path, method.as_deref());
    shared.seen.lock().expect("seen").push(Seen {
        path: path.clone(),
        method: method.clone(),
        body: json.clone(),
        fault: fault.clone(),
    });
    let rpc_id = json.get("id").cloned().unwrap_or(Value::Null);
    match &fault {
        Some(Fault::RpcError { code, message }) => {
            let body = json!({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}});
            return (
                StatusCode::OK,
                [("content-type", "application/json")],
                body.to_string(),
            )
                .into_response();
        }
        Some(Fault::Status(s)) => {
            return (
                StatusCode::from_u16(*s).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "chaos",
            )
                .into_response()
        }
        _ => {}
    }

    let upstream = shared.upstream.lock().expect("upstream").clone();
    let url = match parts.uri.query() {
        Some(q) => format!("{upstream}{path}?{q}"),
        None => format!("{upstream}{path}"),
    };
    let mut rb = shared.http.request(parts.method.clone(), url);
    for (k, v) in &parts.headers {
        if !HOP.contains(&k.as_str()) {
            rb = rb.header(k, v);
        }
    }
    let mut gen_rx = shared.generation.subscribe();
    let resp = tokio::select! {
        r = rb.body(body).send() => r,
        _ = gen_rx.changed() => return broken(),
    };
    let resp = match resp {
        Ok(r) => r,
        // The upstream is unreachable: the client sees its connection closed.
        Err(_) => return broken(),
    };
    let status = resp.status();
    let mut headers = HeaderMap::new();
    for (k, v) in resp.headers() {
        if !HOP.contains(&k.as_str()) {
            if let Ok(name) = HeaderName::from_bytes(k.as_str().as_bytes()) {
                headers.insert(name, v.clone());
            }
        }
    }
    let upstream_body = resp.bytes_stream();
    let stream = faulty(upstream_body, fault, rpc_id, gen_rx, shared.clone());
    let mut out = Response::new(Body::from_stream(stream));
    *out.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    *out.headers_mut() = headers;
    out
}

/// A response whose body fails at once: the client sees a broken connection.
fn broken() -> Response {
    let s =
        futures_util::stream::once(async { Err::<Bytes, _>(std::io::Error::other("chaos: cut")) });
    Response::new(Body::from_stream(s))
}

/// Splits complete SSE frames off the front of `buf`.
fn split_frames(buf: &mut Vec<u8>) -> Vec<Vec<u8>> {
    let mut out = vec![];
    loop {
        let mut end = None;
        let mut i = 0;
        while i + 1 < buf.len() {
            if buf[i] == b'\n' && buf[i + 1] == b'\n' {
                end = Some(i + 2);
                break;
            }
            if i + 3 < buf.len() && &buf[i..i + 4] == b"\r\n\r\n" {
                end = Some(i + 4);
                break;
            }
            i += 1;
        }
        match end {
            Some(e) => out.push(buf.drain(..e).collect()),
            None => return out,
        }
    }
}

struct OpenGuard(Arc<Shared>);
impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

type Up = std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<Bytes>> + Send>>;

fn faulty(
    upstream: impl futures_util::Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    fault: Option<Fault>,
    rpc_id: Value,
    gen_rx: tokio::sync::watch::Receiver<u64>,
    shared: Arc<Shared>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    shared.open.fetch_add(1, Ordering::SeqCst);
    let guard = OpenGuard(shared);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    let up: Up = Box::pin(upstream);
    tokio::spawn(async move {
        let _guard = guard;
        pump(up, fault, rpc_id, gen_rx, tx).await;
    });
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) })
}

/// What the pump does next after a frame boundary.
enum Step {
    Go,
    Stop,
}

async fn pump(
    mut up: Up,
    fault: Option<Fault>,
    rpc_id: Value,
    mut gen_rx: tokio::sync::watch::Receiver<u64>,
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let mut buf = Vec::new();
    let mut frames_sent = 0usize;
    let mut fired = false;
    loop {
        // Faults that fire at a frame boundary, without waiting for more of the stream.
        if !fired {
            if let Step::Stop =
                at_boundary(&fault, frames_sent, &mut fired, &rpc_id, &tx, &mut gen_rx).await
            {
                return;
            }
        }
        let chunk = tokio::select! {
            c = up.next() => c,
            _ = gen_rx.changed() => {
                let _ = tx.send(cut()).await;
                return;
            }
            () = tx.closed() => return,
        };
        let chunk = match chunk {
            Some(Ok(c)) => c,
            Some(Err(_)) => {
                let _ = tx.send(cut()).await;
                return;
            }
            None => {
                if !buf.is_empty() {
                    let _ = tx.send(Ok(Bytes::from(std::mem::take(&mut buf)))).await;
                }
                return;
            }
        };
        if fault.is_none() {
            if tx.send(Ok(chunk)).await.is_err() {
                return;
            }
            continue;
        }
        buf.extend_from_slice(&chunk);
        for frame in split_frames(&mut buf) {
            if !fired {
                if let Step::Stop =
                    at_boundary(&fault, frames_sent, &mut fired, &rpc_id, &tx, &mut gen_rx).await
                {
                    return;
                }
                match &fault {
                    Some(Fault::Truncate { after }) if frames_sent >= *after => {
                        let half = frame.len() / 2;
                        let _ = tx.send(Ok(Bytes::from(frame[..half].to_vec()))).await;
                        return;
                    }
                    Some(Fault::Delay(d)) => tokio::time::sleep(*d).await,
                    _ => {}
                }
            }
            if tx.send(Ok(Bytes::from(frame))).await.is_err() {
                return;
            }
            frames_sent += 1;
        }
    }
}

fn cut() -> Result<Bytes, std::io::Error> {
    Err(std::io::Error::other("chaos: cut"))
}

async fn at_boundary(
    fault: &Option<Fault>,
    frames_sent: usize,
    fired: &mut bool,
    rpc_id: &Value,
    tx: &tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    gen_rx: &mut tokio::sync::watch::Receiver<u64>,
) -> Step {
    match fault {
        Some(Fault::Cut { after }) if frames_sent >= *after => {
            let _ = tx.send(cut()).await;
            Step::Stop
        }
        Some(Fault::End { after }) if frames_sent >= *after => Step::Stop,
        Some(Fault::Stall { after }) if frames_sent >= *after => {
            // Hold the connection open, sending nothing, until the client leaves or the kernel
            // "restarts".
            tokio::select! {
                () = tx.closed() => {}
                _ = gen_rx.changed() => { let _ = tx.send(cut()).await; }
            }
            Step::Stop
        }
        Some(Fault::Garbage { after, bytes }) if frames_sent >= *after => {
            *fired = true;
            if tx.send(Ok(Bytes::from(bytes.clone()))).await.is_err() {
                return Step::Stop;
            }
            Step::Go
        }
        Some(Fault::StreamRpcError {
            after,
            code,
            message,
        }) if frames_sent >= *after => {
            let err = json!({"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}});
            let _ = tx
                .send(Ok(Bytes::from(format!(
                    "event: error\r\ndata: {err}\r\n\r\n"
                ))))
                .await;
            Step::Stop
        }
        _ => Step::Go,
    }
}
