//! The client: unary JSON-RPC calls and the kernel's HTTP extensions over a small connection
//! pool, streaming calls over a connection of their own each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::{HeaderName, HeaderValue};
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument as _;

use crate::stream::{self, EventStream};
use crate::wire::{
    EnsureRestored, GetTaskParams, ListTasksParams, Message, RpcRequest, SendParams, TaskIdParams,
};
use crate::{rpc_result, sse, Error, Task, TaskState};

/// Idle kernel connections kept for reuse.
pub const POOL_IDLE_PER_KERNEL: usize = 32;

/// The most bytes of a unary answer (a task with its history, a pipeline's events): what a
/// stream's frame may carry, so a misbehaving kernel cannot grow memory without bound.
pub const MAX_UNARY_BODY: usize = 16 * 1024 * 1024;

/// A unary answer's body, refused once it passes [`MAX_UNARY_BODY`] (read no further).
async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, Error> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_UNARY_BODY as u64)
    {
        return Err(Error::Protocol("response body too large".into()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > MAX_UNARY_BODY {
            return Err(Error::Protocol("response body too large".into()));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Timeouts of the client.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TCP connect.
    pub connect: Duration,
    /// Whole unary call (request, response headers and body).
    pub unary: Duration,
    /// From sending a streaming request to its response headers.
    pub stream_open: Duration,
    /// Longest silence (no byte at all, pings included) inside an open stream before it is
    /// abandoned as a transport error; zero waits forever. The kernel pings every 15 s.
    pub stream_idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(5),
            // CancelTask drains for up to 30 s in the kernel.
            unary: Duration::from_secs(60),
            // The kernel pulls the first event before it answers with headers.
            stream_open: Duration::from_secs(120),
            stream_idle: Duration::from_secs(60),
        }
    }
}

/// Outcome of `POST /iac-code/session/ensure-restored`.
#[derive(Debug, Clone, PartialEq)]
pub enum RestoreOutcome {
    /// `current` or `restored`.
    Ready,
    /// 404: the session does not exist any more.
    NotFound,
    /// 409 `SESSION_BACKUP_NOT_READY` with `retryable: true`; the kernel's message if any.
    BackupNotReady(Option<String>),
}

/// Where streaming requests go: the parts of a plain `http://` base URL.
#[derive(Debug, Clone)]
struct StreamTarget {
    host: String,
    port: u16,
    /// The `Host` header.
    authority: String,
    /// Request target (path and query).
    path: String,
}

impl StreamTarget {
    fn parse(base: &str) -> Option<StreamTarget> {
        let uri: hyper::Uri = base.parse().ok()?;
        if uri.scheme_str() != Some("http") {
            return None;
        }
        let authority = uri.authority()?;
        if authority.as_str().contains('@') {
            return None;
        }
        Some(StreamTarget {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_owned(),
            path: uri
                .path_and_query()
                .map_or("/".to_owned(), |p| p.as_str().to_owned()),
        })
    }
}

/// What a caller learns of each kernel call, and adds to it. Each call runs in a span of its own
/// (`kernel.call`, with `rpc.method`), current while `headers` is asked.
pub trait Observer: Send + Sync + 'static {
    /// Headers for the call's request (W3C trace context, say).
    fn headers(&self) -> Vec<(HeaderName, HeaderValue)>;
    /// The call ended after `took` (a stream: once its response head came, or it failed).
    fn finished(&self, method: &'static str, took: Duration, ok: bool);
}

#[derive(Clone)]
struct Observed(Option<Arc<dyn Observer>>);

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "observed" } else { "-" })
    }
}

/// The client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    /// Normalised base URL: exactly one trailing `/`.
    base: String,
    bearer: Option<String>,
    timeouts: Timeouts,
    /// `None` for a base URL streams cannot use (not plain `http://`).
    target: Option<StreamTarget>,
    observer: Observed,
}

/// The span of one kernel call.
fn call_span(method: &'static str) -> tracing::Span {
    tracing::info_span!(
        "kernel.call",
        otel.name = method,
        otel.kind = "client",
        rpc.system = "jsonrpc",
        rpc.method = method
    )
}

impl Client {
    /// `base_url` must be the kernel's loopback URL; trailing slashes are normalised.
    pub fn new(base_url: &str, token: Option<String>, timeouts: Timeouts) -> Client {
        let http = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .tcp_nodelay(true)
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(30))
            // After a burst of concurrent runs, keep a few warm connections, not one per run.
            .pool_max_idle_per_host(POOL_IDLE_PER_KERNEL)
            .build()
            .expect("reqwest client builds");
        let base = format!("{}/", base_url.trim_end_matches('/'));
        Client {
            http,
            target: StreamTarget::parse(&base),
            base,
            bearer: token
                .filter(|t| !t.is_empty())
                .map(|t| format!("Bearer {t}")),
            timeouts,
            observer: Observed(None),
        }
    }

    /// The same client, telling `observer` of every call.
    pub fn with_observer(mut self, observer: Arc<dyn Observer>) -> Client {
        self.observer = Observed(Some(observer));
        self
    }

    /// The observer's headers, asked in the current (the call's) span.
    fn extra_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        self.observer
            .0
            .as_ref()
            .map(|o| o.headers())
            .unwrap_or_default()
    }

    /// Runs one call in its span, and tells the observer how long it took.
    async fn observed<T>(
        &self,
        method: &'static str,
        call: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let r = call.instrument(call_span(method)).await;
        if let Some(o) = &self.observer.0 {
            o.finished(method, started.elapsed(), r.is_ok());
        }
        r
    }

    /// The normalised base URL (with one trailing `/`).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let mut rb = self.http.request(method, url).header("A2A-Version", "1.0");
        if let Some(b) = &self.bearer {
            rb = rb.header(reqwest::header::AUTHORIZATION, b);
        }
        for (k, v) in self.extra_headers() {
            rb = rb.header(k, v);
        }
        rb
    }

    /// Bounds a unary call.
    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        tokio::time::timeout(self.timeouts.unary, fut)
            .await
            .map_err(|_| Error::transport("timeout"))?
    }

    /// A unary JSON-RPC call: returns `result`, or the JSON-RPC error.
    async fn call(&self, method: &'static str, params: impl Serialize) -> Result<Value, Error> {
        tracing::debug!(method, "kernel call");
        let body = RpcRequest::body(method, params);
        // Boxed: callers' futures stay small.
        Box::pin(self.observed(
            method,
            self.bounded(async {
                let resp = self
                    .request(reqwest::Method::POST, &self.base)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body)
                    .send()
                    .await?;
                let status = resp.status();
                let bytes = read_capped(resp).await?;
                let body: Value = serde_json::from_slice(&bytes)
                    .map_err(|_| Error::Protocol("response is not JSON".into()))?;
                if !status.is_success() {
                    return Err(Error::Status {
                        status: status.as_u16(),
                        body,
                    });
                }
                rpc_result(body)
            }),
        ))
        .await
    }

    /// A streaming JSON-RPC call.
    async fn stream(
        &self,
        method: &'static str,
        params: impl Serialize,
    ) -> Result<EventStream, Error> {
        tracing::debug!(method, "kernel stream");
        let body = RpcRequest::body(method, params);
        // Boxed: the opening's state lives only while it runs, not inside every caller's
        // future for the whole stream.
        Box::pin(self.observed(method, async {
            let Some(t) = &self.target else {
                return Err(Error::transport("unsupported kernel URL scheme"));
            };
            let tcp = tokio::time::timeout(
                self.timeouts.connect,
                tokio::net::TcpStream::connect((t.host.as_str(), t.port)),
            )
            .await
            .map_err(|_| Error::transport("connect"))?
            .map_err(|_| Error::transport("connect"))?;
            let _ = tcp.set_nodelay(true);
            let extra = self.extra_headers();
            let head = stream::Head {
                path: &t.path,
                host: &t.authority,
                bearer: self.bearer.as_deref(),
                extra: &extra,
            };
            stream::open(
                hyper_util::rt::TokioIo::new(tcp),
                head,
                body,
                &self.timeouts,
                sse::Limits::default(),
            )
            .await
        }))
        .await
    }

    /// `SendStreamingMessage`.
    pub async fn send_streaming_message(
        &self,
        message: &Message<'_>,
    ) -> Result<EventStream, Error> {
        self.stream("SendStreamingMessage", SendParams::new(message))
            .await
    }

    /// Unary `SendMessage`.
    pub async fn send_message(&self, message: &Message<'_>) -> Result<Value, Error> {
        self.call("SendMessage", SendParams::new(message)).await
    }

    /// `GetTask` with up to `history_length` history messages.
    pub async fn get_task(&self, id: &str, history_length: u32) -> Result<Task, Error> {
        let params = GetTaskParams { id, history_length };
        self.call("GetTask", params).await.map(Task::new)
    }

    /// `ListTasks`: the first page (at most `page_size`) of the context's tasks in `state`,
    /// without history.
    pub async fn list_tasks(
        &self,
        context_id: &str,
        state: &TaskState,
        page_size: u32,
    ) -> Result<Vec<Task>, Error> {
        let params = ListTasksParams {
            context_id,
            status: state,
            page_size,
            history_length: 0,
        };
        let mut r = self.call("ListTasks", params).await?;
        Ok(match r.get_mut("tasks").map(Value::take) {
            Some(Value::Array(tasks)) => tasks.into_iter().map(Task::new).collect(),
            _ => Vec::new(),
        })
    }

    /// `SubscribeToTask`.
    pub async fn subscribe_to_task(&self, id: &str) -> Result<EventStream, Error> {
        self.stream("SubscribeToTask", TaskIdParams { id }).await
    }

    /// `CancelTask`: the task (state CANCELED) or a JSON-RPC error.
    pub async fn cancel_task(&self, id: &str) -> Result<Task, Error> {
        self.call("CancelTask", TaskIdParams { id })
            .await
            .map(Task::new)
    }

    /// `GET /health` of the kernel.
    pub async fn health(&self, timeout: Duration) -> Result<(), Error> {
        // Not observed: a liveness probe is no call of a run (and would be a trace of its own).
        let url = format!("{}health", self.base);
        let mut rb = self.http.get(&url).header("A2A-Version", "1.0");
        if let Some(b) = &self.bearer {
            rb = rb.header(reqwest::header::AUTHORIZATION, b);
        }
        let resp = tokio::time::timeout(timeout, rb.send())
            .await
            .map_err(|_| Error::transport("timeout"))??;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(Error::Status {
                status: resp.status().as_u16(),
                body: Value::Null,
            })
        }
    }

    /// `GET /.well-known/agent-card.json`: the kernel's Agent Card (at most 256 KiB, within
    /// `timeout`).
    pub async fn agent_card(&self, timeout: Duration) -> Result<Value, Error> {
        const MOST: usize = 256 * 1024;
        let url = format!("{}.well-known/agent-card.json", self.base);
        let fetch = async {
            let mut resp = self.request(reqwest::Method::GET, &url).send().await?;
            if !resp.status().is_success() {
                return Err(Error::Status {
                    status: resp.status().as_u16(),
                    body: Value::Null,
                });
            }
            let mut bytes = Vec::new();
            while let Some(chunk) = resp.chunk().await? {
                if bytes.len() + chunk.len() > MOST {
                    return Err(Error::Protocol("the agent card is too large".into()));
                }
                bytes.extend_from_slice(&chunk);
            }
            serde_json::from_slice(&bytes)
                .map_err(|_| Error::Protocol("the agent card is not JSON".into()))
        };
        tokio::time::timeout(timeout, fetch)
            .await
            .map_err(|_| Error::transport("timeout"))?
    }

    /// `POST /iac-code/session/ensure-restored`: makes the session (and the task's claim) current
    /// on this kernel.
    pub async fn ensure_restored(
        &self,
        cwd: &str,
        session_id: &str,
        task_id: Option<&str>,
    ) -> Result<RestoreOutcome, Error> {
        let url = format!("{}iac-code/session/ensure-restored", self.base);
        let body = serde_json::to_vec(&EnsureRestored {
            cwd,
            session_id,
            task_id,
        })
        .expect("serialises");
        let call = self.bounded(async {
            let resp = self
                .request(reqwest::Method::POST, &url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body)
                .send()
                .await?;
            let status = resp.status().as_u16();
            let bytes = read_capped(resp).await?;
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            match status {
                200..=299 => match v.get("status").and_then(Value::as_str) {
                    Some("current") | Some("restored") => Ok(RestoreOutcome::Ready),
                    _ => Err(Error::Protocol("unexpected session restore status".into())),
                },
                404 => Ok(RestoreOutcome::NotFound),
                409 => {
                    let err = crate::RpcError {
                        code: 0,
                        message: String::new(),
                        data: v.get("error").cloned().unwrap_or(Value::Null),
                    };
                    if err.is_backup_not_ready() {
                        Ok(RestoreOutcome::BackupNotReady(
                            err.data
                                .get("message")
                                .and_then(Value::as_str)
                                .filter(|m| !m.is_empty())
                                .map(str::to_owned),
                        ))
                    } else {
                        Err(Error::Status { status, body: v })
                    }
                }
                _ => Err(Error::Status { status, body: v }),
            }
        });
        self.observed("ensure-restored", call).await
    }

    /// `GET /iac-code/pipeline/state?taskId=…&afterSequence=…`: the pipeline's events after a
    /// sequence number; `None` when the task has no pipeline.
    pub async fn pipeline_state(
        &self,
        task_id: &str,
        after_sequence: u64,
    ) -> Result<Option<Value>, Error> {
        let url = format!("{}iac-code/pipeline/state", self.base);
        let call = self.bounded(async {
            let resp = self
                .request(reqwest::Method::GET, &url)
                .query(&[
                    ("taskId", task_id.to_owned()),
                    ("afterSequence", after_sequence.to_string()),
                ])
                .send()
                .await?;
            let status = resp.status().as_u16();
            let bytes = read_capped(resp).await?;
            if status == 404 {
                return Ok(None);
            }
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|_| Error::Protocol("pipeline state is not JSON".into()))?;
            if !(200..300).contains(&status) {
                return Err(Error::Status { status, body: v });
            }
            Ok(Some(v))
        });
        self.observed("pipeline-state", call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A kernel that answers every request with `head` and then 1 MiB chunks of `{` without end
    /// (until the client goes away); it counts the bytes it could send.
    async fn endless(head: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", l.local_addr().unwrap());
        let sent = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 8192];
                    let _ = s.read(&mut buf).await;
                    let _ = s.write_all(head.as_bytes()).await;
                    let chunk = vec![b'{'; 1 << 20];
                    let framed = head.contains("chunked");
                    loop {
                        if framed && s.write_all(b"100000\r\n").await.is_err() {
                            break;
                        }
                        if s.write_all(&chunk).await.is_err() {
                            break;
                        }
                        if framed && s.write_all(b"\r\n").await.is_err() {
                            break;
                        }
                        counter.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        (url, sent)
    }

    #[tokio::test]
    async fn a_unary_answer_past_the_bound_is_refused_not_buffered() {
        for head in [
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 209715200\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n",
        ] {
            let (url, sent) = endless(head).await;
            let client = Client::new(&url, None, Timeouts::default());
            let err = client.get_task("t", 100).await.unwrap_err();
            assert!(
                matches!(&err, Error::Protocol(m) if m == "response body too large"),
                "{head:?}: {err:?}"
            );
            let read = sent.load(std::sync::atomic::Ordering::Relaxed);
            assert!(read < 2 * MAX_UNARY_BODY, "{head:?}: {read} bytes went out");
            let (url, _) = endless(head).await;
            let err = Client::new(&url, None, Timeouts::default())
                .pipeline_state("t", 0)
                .await
                .unwrap_err();
            assert!(matches!(&err, Error::Protocol(_)), "{head:?}: {err:?}");
        }
    }

    #[test]
    fn stream_targets() {
        let t = StreamTarget::parse("http://127.0.0.1:8123/").unwrap();
        assert_eq!(
            (
                t.host.as_str(),
                t.port,
                t.authority.as_str(),
                t.path.as_str()
            ),
            ("127.0.0.1", 8123, "127.0.0.1:8123", "/")
        );
        let t = StreamTarget::parse("http://[::1]/a2a/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.path.as_str()),
            ("::1", 80, "/a2a/")
        );
        assert!(StreamTarget::parse("https://127.0.0.1:1/").is_none());
        assert!(StreamTarget::parse("http://u:p@127.0.0.1:1/").is_none());
    }
}
