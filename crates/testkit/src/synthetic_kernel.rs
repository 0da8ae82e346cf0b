//! A synthetic A2A kernel for load: answers `SendStreamingMessage` according to the user text.
//!
//! * `deltas:N` — a task item, N text deltas as fast as the socket takes them, then
//!   input-required (turn finished).
//! * `paced:N:MICROS` — N deltas, one every MICROS µs; each delta's text is the send time in µs
//!   since the Unix epoch (for latency measurement).
//! * `park:MS` — a task item, then silence for MS milliseconds (the gateway heartbeats), then done.
//!
//! Frames are pre-serialised once per run and written in batches: the kernel costs as little as
//! possible, so the gateway is what gets measured.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::response::Response;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// The running synthetic kernel.
#[derive(Clone, Debug)]
pub struct SyntheticKernel {
    pub addr: SocketAddr,
}

fn frame(id: &Value, result: Value) -> String {
    format!(
        "data: {}\r\n\r\n",
        json!({"result": result, "id": id, "jsonrpc": "2.0"})
    )
}

pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

async fn rpc(body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = v.get("id").cloned().unwrap_or(Value::Null);
    let method = v["method"].as_str().unwrap_or("");
    if method != "SendStreamingMessage" {
        // CancelTask and friends: a canceled task.
        let task = v["params"]["id"].as_str().unwrap_or("");
        let out = json!({"result": {"id": task, "status": {"state": "TASK_STATE_CANCELED"}}, "id": id, "jsonrpc": "2.0"});
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(out.to_string()))
            .expect("response");
    }
    let msg = &v["params"]["message"];
    let ctx = msg["contextId"].as_str().unwrap_or("ctx").to_owned();
    let text: String = msg["parts"]
        .as_array()
        .map(|p| p.iter().filter_map(|x| x["text"].as_str()).collect())
        .unwrap_or_default();
    let task = format!("task-{}", now_micros());
    let start = frame(
        &id,
        json!({"task": {"id": task, "contextId": ctx, "status": {"state": "TASK_STATE_SUBMITTED"},
        "metadata": {"iac_code": {"iacCodeSessionId": "synthetic-session"}}}}),
    );
    let done = frame(
        &id,
        json!({"statusUpdate": {"taskId": task, "contextId": ctx, "status": {"state": "TASK_STATE_INPUT_REQUIRED"}}}),
    );
    let (id, task, ctx) = (id.clone(), task.clone(), ctx.clone());
    let delta = move |t: &str| {
        frame(
            &id,
            json!({"statusUpdate": {"taskId": task, "contextId": ctx, "status": {"state": "TASK_STATE_WORKING",
            "message": {"messageId": format!("{task}-message"), "role": "ROLE_AGENT", "parts": [{"text": t}]}}}}),
        )
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(4);
    let mut parts = text.trim().split(':');
    let kind = parts.next().unwrap_or("").to_owned();
    let a: u64 = parts.next().and_then(|x| x.parse().ok()).unwrap_or(1);
    let b: u64 = parts.next().and_then(|x| x.parse().ok()).unwrap_or(1000);
    tokio::spawn(async move {
        if tx.send(Ok(Bytes::from(start))).await.is_err() {
            return;
        }
        match kind.as_str() {
            "paced" => {
                // The frame is serialised once; only the timestamp changes.
                let template = delta("@@TS@@");
                let (head, tail) = template.split_once("@@TS@@").expect("placeholder");
                let (head, tail) = (head.to_owned(), tail.to_owned());
                let mut tick = tokio::time::interval(Duration::from_micros(b.max(1)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                for _ in 0..a {
                    tick.tick().await;
                    let mut f = String::with_capacity(head.len() + tail.len() + 20);
                    f.push_str(&head);
                    f.push_str(&now_micros().to_string());
                    f.push_str(&tail);
                    if tx.send(Ok(Bytes::from(f))).await.is_err() {
                        return;
                    }
                }
            }
            "park" => {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(a)) => {}
                    _ = tx.closed() => return,
                }
            }
            _ => {
                // As fast as the socket takes them, 256 frames per write.
                let one = delta("x");
                let batch: String = one.repeat(256);
                let batch = Bytes::from(batch);
                let mut left = a;
                while left >= 256 {
                    if tx.send(Ok(batch.clone())).await.is_err() {
                        return;
                    }
                    left -= 256;
                }
                if left > 0
                    && tx
                        .send(Ok(Bytes::from(one.repeat(left as usize))))
                        .await
                        .is_err()
                {
                    return;
                }
            }
        }
        let _ = tx.send(Ok(Bytes::from(done))).await;
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    Response::builder()
        .header("content-type", "text/event-stream; charset=utf-8")
        .body(Body::from_stream(stream))
        .expect("response")
}

impl SyntheticKernel {
    pub async fn start() -> SyntheticKernel {
        use axum::serve::ListenerExt;
        // A deep accept queue: bursts of streams must not wait for SYN retries.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.1:0".parse().expect("addr"))
            .expect("bind");
        let listener = socket.listen(4096).expect("listen");
        let addr = listener.local_addr().expect("addr");
        // Like uvicorn: TCP_NODELAY, so paced frames are not held back by Nagle.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let app = Router::new()
            .route("/", post(rpc))
            .route("/health", get(|| async { "{\"status\":\"healthy\"}" }));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        SyntheticKernel { addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }
}
