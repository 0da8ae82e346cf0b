//! A scriptable fake A2A kernel on 127.0.0.1: records every request and replays scripted JSON-RPC
//! answers, SSE items, stalls, cuts and errors.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// One element of a scripted SSE answer.
#[derive(Debug, Clone)]
pub enum Item {
    /// A JSON-RPC result item: `data: {"jsonrpc":"2.0","id":…,"result":<value>}` (CRLF framing).
    Result(Value),
    /// Raw bytes written as they are.
    Raw(String),
    /// Pause.
    Sleep(Duration),
    /// Abort the response mid-stream (the client sees a broken body).
    Cut,
    /// Keep the stream open without writing anything, until the client goes away.
    Stall,
}

/// A scripted answer to one request.
#[derive(Debug, Clone)]
pub enum Reply {
    Sse(Vec<Item>),
    /// A JSON body with a status.
    Json(u16, Value),
}

/// A recorded request.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    /// JSON-RPC method for `POST /`.
    pub method: Option<String>,
    pub body: Value,
    pub headers: HashMap<String, String>,
    pub query: Option<String>,
}

#[derive(Default)]
struct Inner {
    replies: HashMap<String, VecDeque<Reply>>,
    requests: Vec<Request>,
    /// SSE result items written to the socket so far (backpressure tests).
    written: Arc<std::sync::atomic::AtomicUsize>,
    /// `/health` answers 503 (a kernel that stopped answering its probes).
    down: bool,
}

/// The running fake kernel.
#[derive(Clone)]
pub struct FakeKernel {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

/// Helpers to build kernel items (A2A 1.0 wire).
pub mod items {
    use serde_json::{json, Value};

    pub fn task(id: &str, ctx: &str, state: &str, meta: Value) -> Value {
        json!({"task": {"id": id, "contextId": ctx, "status": {"state": state}, "metadata": {"iac_code": meta}}})
    }
    pub fn status(task: &str, ctx: &str, state: &str, meta: Value) -> Value {
        json!({"statusUpdate": {"taskId": task, "contextId": ctx, "status": {"state": state}, "metadata": {"iac_code": meta}}})
    }
    pub fn text(task: &str, ctx: &str, text: &str, message_id: &str, meta: Value) -> Value {
        json!({"statusUpdate": {"taskId": task, "contextId": ctx, "status": {"state": "TASK_STATE_WORKING",
            "message": {"role": "ROLE_AGENT", "parts": [{"text": text}], "messageId": message_id}},
            "metadata": {"iac_code": meta}}})
    }
    pub fn artifact(task: &str, ctx: &str, artifact: Value) -> Value {
        json!({"artifactUpdate": {"taskId": task, "contextId": ctx, "artifact": artifact}})
    }
    pub fn bare_task(id: &str, ctx: &str, state: &str, meta: Value) -> Value {
        json!({"id": id, "contextId": ctx, "status": {"state": state}, "metadata": {"iac_code": meta}})
    }
}

/// One task's SSE answer, built an item a line: the task and context are named once, not at
/// every item (`Stream::of("task-1", &c).submitted(meta).text("hi", "m1").completed()`).
#[derive(Debug, Clone)]
pub struct Stream {
    task: String,
    ctx: String,
    items: Vec<Item>,
}

impl Stream {
    /// An empty answer for the task `task` of the context `ctx`.
    pub fn of(task: &str, ctx: &str) -> Stream {
        Stream {
            task: task.into(),
            ctx: ctx.into(),
            items: vec![],
        }
    }
    /// Any item (a pause, a cut, raw bytes, another task's result).
    pub fn then(mut self, item: Item) -> Self {
        self.items.push(item);
        self
    }
    /// The task object itself in `state`.
    pub fn task(self, state: &str, meta: Value) -> Self {
        let v = items::task(&self.task, &self.ctx, state, meta);
        self.then(Item::Result(v))
    }
    /// The task object, `SUBMITTED` (how a new turn's answer begins).
    pub fn submitted(self, meta: Value) -> Self {
        self.task("TASK_STATE_SUBMITTED", meta)
    }
    /// A status update in `state`.
    pub fn status(self, state: &str, meta: Value) -> Self {
        let v = items::status(&self.task, &self.ctx, state, meta);
        self.then(Item::Result(v))
    }
    /// A `WORKING` status update.
    pub fn working(self, meta: Value) -> Self {
        self.status("TASK_STATE_WORKING", meta)
    }
    /// An `INPUT_REQUIRED` status update (an interrupt: `input` or `pendingPermissions`).
    pub fn input_required(self, meta: Value) -> Self {
        self.status("TASK_STATE_INPUT_REQUIRED", meta)
    }
    /// The terminal `COMPLETED` status update.
    pub fn completed(self) -> Self {
        self.status("TASK_STATE_COMPLETED", json!({}))
    }
    /// Agent text with no metadata.
    pub fn text(self, text: &str, message_id: &str) -> Self {
        self.text_with(text, message_id, json!({}))
    }
    /// Agent text with metadata.
    pub fn text_with(self, text: &str, message_id: &str, meta: Value) -> Self {
        let v = items::text(&self.task, &self.ctx, text, message_id, meta);
        self.then(Item::Result(v))
    }
    /// An artifact update.
    pub fn artifact(self, artifact: Value) -> Self {
        let v = items::artifact(&self.task, &self.ctx, artifact);
        self.then(Item::Result(v))
    }
    /// The scripted answer.
    pub fn reply(self) -> Reply {
        Reply::Sse(self.items)
    }
}

impl From<Stream> for Reply {
    fn from(s: Stream) -> Reply {
        s.reply()
    }
}

impl Reply {
    /// `GetTask`'s answer: the bare task in `state`.
    pub fn task(id: &str, ctx: &str, state: &str, meta: Value) -> Reply {
        Reply::Json(200, items::bare_task(id, ctx, state, meta))
    }
}

impl FakeKernel {
    pub async fn start() -> FakeKernel {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/", post(rpc))
            .route("/health", get(health))
            .route("/iac-code/session/ensure-restored", post(ext_post))
            .route("/iac-code/pipeline/state", get(ext_get))
            .with_state(inner.clone());
        let addr = crate::serve(app).await;
        FakeKernel { addr, inner }
    }

    /// `http://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Queues an answer for a JSON-RPC method or an extension path
    /// (`ensure-restored`, `pipeline-state`).
    pub fn on(&self, key: &str, reply: impl Into<Reply>) {
        let reply = reply.into();
        self.inner
            .lock()
            .expect("kernel lock")
            .replies
            .entry(key.to_owned())
            .or_default()
            .push_back(reply);
    }

    /// Queues an answer for a JSON-RPC method of the context `context_id` only (a streaming
    /// message's `contextId`): it is given before any queued with [`FakeKernel::on`].
    pub fn on_context(&self, key: &str, context_id: &str, reply: impl Into<Reply>) {
        self.on(&format!("{key}@{context_id}"), reply);
    }

    /// Queues the answer to the next `SendStreamingMessage` (a turn or a resume).
    pub fn stream(&self, s: Stream) {
        self.on("SendStreamingMessage", s);
    }

    /// Queues `GetTask`'s answer: the task waiting for input (an interrupt: `input` or
    /// `pendingPermissions` in `meta`), as a resume finds it.
    pub fn task_awaits_input(&self, task: &str, ctx: &str, meta: Value) {
        self.on(
            "GetTask",
            Reply::task(task, ctx, "TASK_STATE_INPUT_REQUIRED", meta),
        );
    }

    /// Queues `GetTask`'s answer: the task still working.
    pub fn task_is_working(&self, task: &str, ctx: &str, meta: Value) {
        self.on(
            "GetTask",
            Reply::task(task, ctx, "TASK_STATE_WORKING", meta),
        );
    }

    /// Makes `/health` answer 503 (`false`) or 200 again.
    pub fn set_healthy(&self, healthy: bool) {
        self.inner.lock().expect("kernel lock").down = !healthy;
    }

    /// SSE result items accepted by the socket so far.
    pub fn items_written(&self) -> usize {
        self.inner
            .lock()
            .expect("kernel lock")
            .written
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.inner.lock().expect("kernel lock").requests.clone()
    }

    /// Requests of one JSON-RPC method.
    pub fn calls(&self, method: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.method.as_deref() == Some(method))
            .collect()
    }

    /// Waits until `method` was called `n` times.
    pub async fn wait_calls(&self, method: &str, n: usize, timeout: Duration) -> Vec<Request> {
        crate::wait_for(n, timeout, || self.calls(method)).await
    }
}

/// The next reply queued under `key`, taken off its queue.
fn next_reply(inner: &Mutex<Inner>, key: &str) -> Option<Reply> {
    inner
        .lock()
        .expect("kernel lock")
        .replies
        .get_mut(key)
        .and_then(VecDeque::pop_front)
}

fn headers_map(h: &HeaderMap) -> HashMap<String, String> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}

fn record(inner: &Mutex<Inner>, r: Request) {
    inner.lock().expect("kernel lock").requests.push(r);
}

fn render(reply: Reply, rpc_id: Value, written: Arc<std::sync::atomic::AtomicUsize>) -> Response {
    match reply {
        Reply::Json(status, body) => (
            StatusCode::from_u16(status).expect("status"),
            [("content-type", "application/json")],
            body.to_string(),
        )
            .into_response(),
        Reply::Sse(items) => {
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
            tokio::spawn(async move {
                for it in items {
                    let r = match it {
                        Item::Result(v) => {
                            let frame = json!({"jsonrpc": "2.0", "id": rpc_id, "result": v});
                            let r = tx
                                .send(Ok(Bytes::from(format!("data: {frame}\r\n\r\n"))))
                                .await;
                            written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            r
                        }
                        Item::Raw(s) => tx.send(Ok(Bytes::from(s))).await,
                        Item::Sleep(d) => {
                            tokio::time::sleep(d).await;
                            Ok(())
                        }
                        Item::Cut => {
                            let _ = tx.send(Err(std::io::Error::other("cut"))).await;
                            return;
                        }
                        Item::Stall => {
                            tx.closed().await;
                            return;
                        }
                    };
                    if r.is_err() {
                        return;
                    }
                }
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|x| (x, rx))
            });
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream; charset=utf-8")
                .body(Body::from_stream(stream))
                .expect("response")
        }
    }
}

async fn rpc(State(inner): State<Arc<Mutex<Inner>>>, headers: HeaderMap, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let method = v
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    record(
        &inner,
        Request {
            path: "/".into(),
            method: Some(method.clone()),
            body: v.clone(),
            headers: headers_map(&headers),
            query: None,
        },
    );
    // A reply queued for the message's context comes first (concurrent runs of many threads).
    let context = v["params"]["message"]["contextId"].as_str().unwrap_or("");
    let reply =
        next_reply(&inner, &format!("{method}@{context}")).or_else(|| next_reply(&inner, &method));
    let reply = reply.unwrap_or_else(|| match method.as_str() {
        "SendStreamingMessage" | "SubscribeToTask" => Reply::Sse(vec![]),
        "CancelTask" => {
            let task = v["params"]["id"].as_str().unwrap_or("").to_owned();
            Reply::Json(
                200,
                json!({"jsonrpc":"2.0","id":id,"result":{"id":task,"contextId":"","status":{"state":"TASK_STATE_CANCELED"}}}),
            )
        }
        _ => Reply::Json(
            200,
            json!({"jsonrpc":"2.0","id":id,"error":{"code":-32001,"message":"Task not found"}}),
        ),
    });
    // Unary JSON replies written as bare results get the envelope added.
    let reply = match reply {
        Reply::Json(s, body) if body.get("jsonrpc").is_none() && s == 200 => {
            if body.get("error").is_some() {
                Reply::Json(200, json!({"jsonrpc":"2.0","id":id,"error":body["error"]}))
            } else {
                Reply::Json(200, json!({"jsonrpc":"2.0","id":id,"result":body}))
            }
        }
        other => other,
    };
    let written = inner.lock().expect("kernel lock").written.clone();
    render(reply, id, written)
}

async fn health(State(inner): State<Arc<Mutex<Inner>>>) -> Response {
    match inner.lock().expect("kernel lock").down {
        true => (StatusCode::SERVICE_UNAVAILABLE, "down").into_response(),
        false => axum::Json(json!({"status":"healthy"})).into_response(),
    }
}

/// An extension endpoint's request: recorded, then answered with the reply queued under `key`,
/// or `default`.
fn extension(inner: &Mutex<Inner>, request: Request, key: &str, default: Reply) -> Response {
    record(inner, request);
    let reply = next_reply(inner, key).unwrap_or(default);
    render(reply, Value::Null, Default::default())
}

async fn ext_post(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request = Request {
        path: "/iac-code/session/ensure-restored".into(),
        method: None,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        headers: headers_map(&headers),
        query: None,
    };
    let current = Reply::Json(200, json!({"status":"current"}));
    extension(&inner, request, "ensure-restored", current)
}

async fn ext_get(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let path = "/iac-code/pipeline/state".into();
    let headers = headers_map(&headers);
    let request = Request {
        path,
        method: None,
        body: Value::Null,
        headers,
        query,
    };
    let none = Reply::Json(404, json!({"error":"A2A pipeline state not found"}));
    extension(&inner, request, "pipeline-state", none)
}
