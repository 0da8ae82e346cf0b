//! A2A 1.0 JSON-RPC client for the iac-code execution kernel (`iac-code a2a`).
//!
//! JSON-RPC 2.0 over HTTP POST to a loopback base URL, with `A2A-Version: 1.0` and an optional bearer
//! token on every call. Streaming methods answer with SSE (`text/event-stream`), or — when the kernel
//! fails before the first event — with a plain JSON-RPC error body, which is classified as an error
//! and never mistaken for data. Every call has a timeout except the read of a stream itself.
#![forbid(unsafe_code)]

pub mod chunked;
pub mod item;
mod raw;
pub mod sse;

#[doc(hidden)]
pub use chunked::dechunk_parts;

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};

pub use item::{ItemView, TaskState};

/// Idle kernel connections kept for reuse.
pub const POOL_IDLE_PER_KERNEL: usize = 32;

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

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Value,
}

impl RpcError {
    fn from_value(v: &Value) -> RpcError {
        RpcError {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            data: v.get("data").cloned().unwrap_or(Value::Null),
        }
    }

    /// True when the kernel says the session backup is not restored yet and the call may be retried.
    pub fn is_backup_not_ready(&self) -> bool {
        self.data.get("code").and_then(Value::as_str) == Some("SESSION_BACKUP_NOT_READY")
            && self.data.get("retryable").and_then(Value::as_bool) == Some(true)
    }
}

/// Errors of kernel calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connection refused/reset, timeout, or the body could not be read.
    #[error("kernel transport error: {0}")]
    Transport(String),
    /// A non-2xx HTTP status.
    #[error("kernel answered HTTP {status}")]
    Status { status: u16, body: Value },
    /// A JSON-RPC error (as a response body or as a stream item).
    #[error("kernel JSON-RPC error {}: {}", .0.code, .0.message)]
    Rpc(RpcError),
    /// The kernel's answer could not be understood (malformed JSON, oversized frame, …).
    #[error("kernel protocol error: {0}")]
    Protocol(String),
}

impl From<reqwest::Error> for Error {
    fn from(e: reqwest::Error) -> Self {
        // Never include the URL's query or any header: only the kind of failure.
        let kind = if e.is_timeout() {
            "timeout"
        } else if e.is_connect() {
            "connect"
        } else if e.is_body() || e.is_decode() {
            "body"
        } else {
            "request"
        };
        Error::Transport(kind.to_owned())
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

/// The client. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    /// Normalised base URL: exactly one trailing `/`.
    base: String,
    bearer: Option<String>,
    timeouts: Timeouts,
    limits: sse::Limits,
    /// Streaming calls go over their own lean connection when the URL is plain `http://`.
    raw: Option<raw::Target>,
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
            raw: raw::Target::parse(&base),
            base,
            bearer: token
                .filter(|t| !t.is_empty())
                .map(|t| format!("Bearer {t}")),
            timeouts,
            limits: sse::Limits::default(),
        }
    }

    /// Overrides the SSE decoder limits.
    pub fn with_sse_limits(mut self, limits: sse::Limits) -> Client {
        self.limits = limits;
        self
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
        rb
    }

    fn rpc_body(method: &str, params: Value) -> Vec<u8> {
        let body = json!({
            "jsonrpc": "2.0",
            "id": uuid::Uuid::new_v4().to_string(),
            "method": method,
            "params": params,
        });
        serde_json::to_vec(&body).expect("request serialises")
    }

    /// A unary JSON-RPC call: returns `result`, or the JSON-RPC error.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, Error> {
        // Boxed, like `stream`: callers' futures stay small.
        Box::pin(self.call_inner(method, params)).await
    }

    async fn call_inner(&self, method: &str, params: Value) -> Result<Value, Error> {
        tracing::debug!(
            method,
            task = params.get("id").and_then(serde_json::Value::as_str),
            "kernel call"
        );
        let fut = async {
            let resp = self
                .request(reqwest::Method::POST, &self.base)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(Self::rpc_body(method, params))
                .send()
                .await?;
            let status = resp.status();
            let bytes = resp.bytes().await?;
            let body: Value = serde_json::from_slice(&bytes)
                .map_err(|_| Error::Protocol("response is not JSON".into()))?;
            if !status.is_success() {
                return Err(Error::Status {
                    status: status.as_u16(),
                    body,
                });
            }
            rpc_result(body)
        };
        tokio::time::timeout(self.timeouts.unary, fut)
            .await
            .map_err(|_| Error::Transport("timeout".into()))?
    }

    /// A streaming JSON-RPC call (`SendStreamingMessage`, `SubscribeToTask`).
    pub async fn stream(&self, method: &str, params: Value) -> Result<EventStream, Error> {
        // Boxed: the opening's state (request, head buffer, connect) lives only while it runs
        // instead of inside every caller's future for the whole stream.
        Box::pin(self.open_stream(method, params)).await
    }

    async fn open_stream(&self, method: &str, params: Value) -> Result<EventStream, Error> {
        tracing::debug!(method, "kernel stream");
        let timeout = |_| Error::Transport("timeout".into());
        let (status, is_sse, body): (u16, bool, ByteStream) = match &self.raw {
            Some(target) => {
                let mut headers =
                    vec![("a2a-version", "1.0"), ("content-type", "application/json")];
                if let Some(b) = &self.bearer {
                    headers.push(("authorization", b));
                }
                let request = Self::rpc_body(method, params);
                let (head, body) = tokio::time::timeout(
                    self.timeouts.stream_open,
                    raw::send(target, &headers, &request, self.timeouts.connect),
                )
                .await
                .map_err(timeout)??;
                (head.status, head.event_stream, Box::pin(body))
            }
            None => {
                let fut = self
                    .request(reqwest::Method::POST, &self.base)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(Self::rpc_body(method, params))
                    .send();
                let resp = tokio::time::timeout(self.timeouts.stream_open, fut)
                    .await
                    .map_err(timeout)??;
                let is_sse = resp
                    .headers()
                    .get(reqwest::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| {
                        v.trim_start()
                            .to_ascii_lowercase()
                            .starts_with("text/event-stream")
                    })
                    .unwrap_or(false);
                (
                    resp.status().as_u16(),
                    is_sse,
                    Box::pin(resp.bytes_stream().map(|r| r.map_err(Error::from))),
                )
            }
        };
        let success = (200..300).contains(&status);
        if !success || !is_sse {
            // D-16: a JSON body where a stream was expected is an error (or, rarely, one result).
            let bytes = tokio::time::timeout(self.timeouts.unary, read_all(body))
                .await
                .map_err(timeout)??;
            let body: Value = serde_json::from_slice(&bytes)
                .map_err(|_| Error::Protocol("response is not JSON".into()))?;
            if !success {
                return Err(Error::Status { status, body });
            }
            let result = rpc_result(body)?;
            return Ok(EventStream {
                inner: StreamInner::Single(Some(result)),
            });
        }
        Ok(EventStream {
            inner: StreamInner::Sse {
                body,
                decoder: sse::Decoder::new(self.limits),
                done: false,
                idle: Idle::new(self.timeouts.stream_idle),
            },
        })
    }

    /// `SendStreamingMessage {message, configuration}`.
    pub async fn send_streaming_message(&self, message: Value) -> Result<EventStream, Error> {
        self.stream("SendStreamingMessage", send_params(message))
            .await
    }

    /// Unary `SendMessage {message, configuration}`.
    pub async fn send_message(&self, message: Value) -> Result<Value, Error> {
        self.call("SendMessage", send_params(message)).await
    }

    /// `GetTask {id, historyLength}`: the bare Task.
    pub async fn get_task(&self, id: &str, history_length: u32) -> Result<Value, Error> {
        self.call(
            "GetTask",
            json!({"id": id, "historyLength": history_length}),
        )
        .await
    }

    /// `ListTasks {contextId, status, pageSize, historyLength: 0}`: the first page of the
    /// context's tasks in that state (bare Task objects).
    pub async fn list_tasks(
        &self,
        context_id: &str,
        status: &str,
        page_size: u32,
    ) -> Result<Vec<Value>, Error> {
        let r = self
            .call(
                "ListTasks",
                json!({"contextId": context_id, "status": status, "pageSize": page_size, "historyLength": 0}),
            )
            .await?;
        Ok(r.get("tasks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default())
    }

    /// `SubscribeToTask {id}`.
    pub async fn subscribe_to_task(&self, id: &str) -> Result<EventStream, Error> {
        self.stream("SubscribeToTask", json!({"id": id})).await
    }

    /// `CancelTask {id}`: the bare Task (state CANCELED) or a JSON-RPC error.
    pub async fn cancel_task(&self, id: &str) -> Result<Value, Error> {
        self.call("CancelTask", json!({"id": id})).await
    }

    /// `GET /health` of the kernel.
    pub async fn health(&self, timeout: Duration) -> Result<(), Error> {
        let url = format!("{}health", self.base);
        let resp = tokio::time::timeout(timeout, self.request(reqwest::Method::GET, &url).send())
            .await
            .map_err(|_| Error::Transport("timeout".into()))??;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(Error::Status {
                status: resp.status().as_u16(),
                body: Value::Null,
            })
        }
    }

    /// `POST /iac-code/session/ensure-restored {cwd, sessionId, taskId?}`.
    pub async fn ensure_restored(
        &self,
        cwd: &str,
        session_id: &str,
        task_id: Option<&str>,
    ) -> Result<RestoreOutcome, Error> {
        let url = format!("{}iac-code/session/ensure-restored", self.base);
        let mut body = json!({"cwd": cwd, "sessionId": session_id});
        if let Some(t) = task_id {
            body["taskId"] = Value::String(t.to_owned());
        }
        let fut = async {
            let resp = self
                .request(reqwest::Method::POST, &url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&body).expect("serialises"))
                .send()
                .await?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await?;
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            match status {
                200..=299 => match v.get("status").and_then(Value::as_str) {
                    Some("current") | Some("restored") => Ok(RestoreOutcome::Ready),
                    _ => Err(Error::Protocol("unexpected session restore status".into())),
                },
                404 => Ok(RestoreOutcome::NotFound),
                409 => {
                    let err = v.get("error").cloned().unwrap_or(Value::Null);
                    if err.get("code").and_then(Value::as_str) == Some("SESSION_BACKUP_NOT_READY")
                        && err.get("retryable").and_then(Value::as_bool) == Some(true)
                    {
                        Ok(RestoreOutcome::BackupNotReady(
                            err.get("message")
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
        };
        tokio::time::timeout(self.timeouts.unary, fut)
            .await
            .map_err(|_| Error::Transport("timeout".into()))?
    }

    /// `GET /iac-code/pipeline/state?taskId=…&afterSequence=…`; `None` on 404.
    pub async fn pipeline_state(
        &self,
        task_id: &str,
        after_sequence: u64,
    ) -> Result<Option<Value>, Error> {
        let url = format!("{}iac-code/pipeline/state", self.base);
        let fut = async {
            let resp = self
                .request(reqwest::Method::GET, &url)
                .query(&[
                    ("taskId", task_id.to_owned()),
                    ("afterSequence", after_sequence.to_string()),
                ])
                .send()
                .await?;
            let status = resp.status().as_u16();
            let bytes = resp.bytes().await?;
            if status == 404 {
                return Ok(None);
            }
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|_| Error::Protocol("pipeline state is not JSON".into()))?;
            if !(200..300).contains(&status) {
                return Err(Error::Status { status, body: v });
            }
            Ok(Some(v))
        };
        tokio::time::timeout(self.timeouts.unary, fut)
            .await
            .map_err(|_| Error::Transport("timeout".into()))?
    }
}

fn send_params(message: Value) -> Value {
    json!({"message": message, "configuration": {"acceptedOutputModes": ["text/plain"]}})
}

fn rpc_result(mut body: Value) -> Result<Value, Error> {
    if let Some(err) = body.get("error").filter(|e| !e.is_null()) {
        return Err(Error::Rpc(RpcError::from_value(err)));
    }
    match body.get_mut("result") {
        Some(r) => Ok(r.take()),
        None => Err(Error::Protocol("JSON-RPC response without result".into())),
    }
}

type ByteStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, Error>> + Send>>;

/// Largest non-stream body read where a stream was expected.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// Reads a whole (bounded) body.
async fn read_all(mut body: ByteStream) -> Result<Vec<u8>, Error> {
    let mut all = Vec::new();
    while let Some(part) = body.next().await {
        all.extend_from_slice(&part?);
        if all.len() > MAX_BODY {
            return Err(Error::Protocol("response body too large".into()));
        }
    }
    Ok(all)
}

enum StreamInner {
    Single(Option<Value>),
    Sse {
        body: ByteStream,
        decoder: sse::Decoder,
        done: bool,
        idle: Idle,
    },
}

/// The silence watchdog of a stream. One timer per idle period, not one per chunk: a chunk only
/// records the time; when the timer fires early it is moved to `last + limit`.
struct Idle {
    limit: Duration,
    last: tokio::time::Instant,
    timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Idle {
    fn new(limit: Duration) -> Idle {
        Idle {
            limit,
            last: tokio::time::Instant::now(),
            timer: None,
        }
    }

    /// Waits for the next chunk of `body`, or fails after `limit` without any.
    async fn next(
        &mut self,
        body: &mut ByteStream,
    ) -> Result<Option<Result<bytes::Bytes, Error>>, Error> {
        if self.limit.is_zero() {
            return Ok(body.next().await);
        }
        let limit = self.limit;
        let last = self.last;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(last + limit)));
        loop {
            tokio::select! {
                biased;
                chunk = body.next() => {
                    self.last = tokio::time::Instant::now();
                    return Ok(chunk);
                }
                () = timer.as_mut() => {
                    let due = self.last + limit;
                    if due <= tokio::time::Instant::now() {
                        return Err(Error::Transport("idle stream".into()));
                    }
                    timer.as_mut().reset(due);
                }
            }
        }
    }
}

/// The items of a kernel stream: each is the JSON-RPC `result` object of one SSE event.
pub struct EventStream {
    inner: StreamInner,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventStream")
    }
}

/// One item of [`EventStream::next_with`].
#[derive(Debug)]
pub enum Next<T> {
    /// The caller's fast parser understood the frame.
    Fast(T),
    /// The frame's JSON-RPC `result` object.
    Item(Value),
}

impl EventStream {
    /// The next `result` object; `Ok(None)` at the end of the stream. A JSON-RPC error item is
    /// returned as [`Error::Rpc`] (D-16), malformed frames as [`Error::Protocol`].
    pub async fn next(&mut self) -> Result<Option<Value>, Error> {
        Ok(self
            .next_with(|_| None::<std::convert::Infallible>)
            .await?
            .map(|n| match n {
                Next::Item(v) => v,
                Next::Fast(never) => match never {},
            }))
    }

    /// Like [`EventStream::next`], but each SSE frame's data is first offered to `fast`; when it
    /// returns `Some`, that is the item and the generic JSON tree is never built.
    pub async fn next_with<T>(
        &mut self,
        fast: impl FnOnce(&[u8]) -> Option<T>,
    ) -> Result<Option<Next<T>>, Error> {
        let data = match &mut self.inner {
            StreamInner::Single(v) => return Ok(v.take().map(Next::Item)),
            StreamInner::Sse {
                body,
                decoder,
                done,
                idle,
            } => loop {
                match decoder.next_frame() {
                    Ok(Some(frame)) => break frame.data,
                    Ok(None) => {}
                    Err(e) => return Err(Error::Protocol(e.to_string())),
                }
                if *done {
                    match decoder.finish() {
                        Ok(Some(frame)) => break frame.data,
                        Ok(None) => return Ok(None),
                        Err(e) => return Err(Error::Protocol(e.to_string())),
                    }
                }
                match idle.next(body).await? {
                    Some(Ok(chunk)) => decoder.push(&chunk),
                    Some(Err(e)) => return Err(e),
                    None => *done = true,
                }
            },
        };
        if let Some(t) = fast(&data) {
            return Ok(Some(Next::Fast(t)));
        }
        Ok(parse_frame(&data)?.map(Next::Item))
    }
}

fn parse_frame(data: &[u8]) -> Result<Option<Value>, Error> {
    let v: Value = serde_json::from_slice(data)
        .map_err(|_| Error::Protocol("a stream frame is not JSON".into()))?;
    if !v.is_object() {
        return Err(Error::Protocol("a stream frame is not an object".into()));
    }
    if v.get("result").is_some_and(Value::is_object) {
        return rpc_result(v).map(Some);
    }
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        return Err(Error::Rpc(RpcError::from_value(err)));
    }
    // A bare object (no JSON-RPC envelope) is used as the item itself.
    Ok(Some(v))
}
