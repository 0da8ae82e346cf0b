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

impl FakeKernel {
    pub async fn start() -> FakeKernel {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake kernel");
        let addr = listener.local_addr().expect("addr");
        let app = Router::new()
            .route("/", post(rpc))
            .route("/health", get(health))
            .route("/iac-code/session/ensure-restored", post(ext_post))
            .route("/iac-code/pipeline/state", get(ext_get))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeKernel { addr, inner }
    }

    /// `http://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Queues an answer for a JSON-RPC method or an extension path
    /// (`ensure-restored`, `pipeline-state`).
    pub fn on(&self, key: &str, reply: Reply) {
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
    pub fn on_context(&self, key: &str, context_id: &str, reply: Reply) {
        self.on(&format!("{key}@{context_id}"), reply);
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
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let c = self.calls(method);
            if c.len() >= n || tokio::time::Instant::now() > deadline {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn next(&self, key: &str) -> Option<Reply> {
        self.inner
            .lock()
            .expect("kernel lock")
            .replies
            .get_mut(key)
            .and_then(VecDeque::pop_front)
    }
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

fn record(inner: &Arc<Mutex<Inner>>, r: Request) {
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
    let fk = FakeKernel {
        addr: "127.0.0.1:0".parse().expect("addr"),
        inner: inner.clone(),
    };
    // A reply queued for the message's context comes first (concurrent runs of many threads).
    let context = v["params"]["message"]["contextId"].as_str().unwrap_or("");
    let reply = fk
        .next(&format!("{method}@{context}"))
        .or_else(|| fk.next(&method));
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

async fn ext_post(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    record(
        &inner,
        Request {
            path: "/iac-code/session/ensure-restored".into(),
            method: None,
            body: v,
            headers: headers_map(&headers),
            query: None,
        },
    );
    let fk = FakeKernel {
        addr: "127.0.0.1:0".parse().expect("addr"),
        inner,
    };
    render(
        fk.next("ensure-restored")
            .unwrap_or(Reply::Json(200, json!({"status":"current"}))),
        Value::Null,
        Default::default(),
    )
}

async fn ext_get(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    record(
        &inner,
        Request {
            path: "/iac-code/pipeline/state".into(),
            method: None,
            body: Value::Null,
            headers: headers_map(&headers),
            query: q,
        },
    );
    let fk = FakeKernel {
        addr: "127.0.0.1:0".parse().expect("addr"),
        inner,
    };
    render(
        fk.next("pipeline-state").unwrap_or(Reply::Json(
            404,
            json!({"error":"A2A pipeline state not found"}),
        )),
        Value::Null,
        Default::default(),
    )
}
