//! A scripted OpenAI-compatible streaming Chat Completions server on 127.0.0.1, driving the real
//! kernel in tests.
//!
//! The reply is chosen from the marker `scenario:<name>` in the latest user message that carries
//! one, and from whether the conversation ends with a tool result (then the reply is a final text
//! quoting it). Built-in scenarios: `text`, `think`, `bash`, `bash2`, `bashro`, `write`, `slow`,
//! `stall`, `error`; tests may register their own plans. Every request is recorded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};

/// One tool call of a plan.
#[derive(Debug, Clone)]
pub struct ToolCall {
    pub name: String,
    pub arguments: Value,
}

/// What the fake LLM answers.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub reasoning: Vec<String>,
    pub text: Vec<String>,
    pub tools: Vec<ToolCall>,
    /// Delay before each text chunk.
    pub delay: Duration,
    /// Silence before the first byte of the stream body.
    pub initial_delay: Duration,
    /// Answer HTTP 400 instead.
    pub error: bool,
}

impl Plan {
    pub fn text(chunks: &[&str]) -> Plan {
        Plan {
            text: chunks.iter().map(|s| s.to_string()).collect(),
            delay: Duration::from_millis(5),
            ..Plan::default()
        }
    }
    pub fn tool(text: &str, name: &str, arguments: Value) -> Plan {
        Plan {
            text: vec![text.to_owned()],
            tools: vec![ToolCall {
                name: name.to_owned(),
                arguments,
            }],
            delay: Duration::from_millis(5),
            ..Plan::default()
        }
    }
}

/// A recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub scenario: String,
    pub body: Value,
    pub headers: HashMap<String, String>,
}

#[derive(Default)]
struct Inner {
    plans: HashMap<String, Plan>,
    requests: Vec<Recorded>,
    /// When each answer's first text piece was sent, by scenario.
    first_texts: Vec<(String, std::time::Instant)>,
}

/// The running fake LLM.
#[derive(Clone)]
pub struct FakeLlm {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    tls: bool,
}

fn content_text(c: &Value) -> String {
    match c {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn scenario_of(messages: &[Value]) -> String {
    for m in messages.iter().rev() {
        if m.get("role").and_then(Value::as_str) == Some("user") {
            let t = content_text(m.get("content").unwrap_or(&Value::Null));
            if let Some(i) = t.find("scenario:") {
                return t[i + 9..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
                    .collect();
            }
        }
    }
    "default".into()
}

fn builtin(scenario: &str) -> Plan {
    match scenario {
        "text" => Plan::text(&["Hello", " from the", " fake LLM."]),
        "think" => Plan {
            reasoning: vec![
                "Let me think".into(),
                " about this".into(),
                " carefully.".into(),
            ],
            text: vec!["After thinking:".into(), " 42.".into()],
            delay: Duration::from_millis(5),
            ..Plan::default()
        },
        "bash" => Plan::tool(
            "I will run a command.",
            "bash",
            json!({"command": "echo agui-test >> out.txt && cat out.txt"}),
        ),
        "bashro" => Plan::tool("Listing files.", "bash", json!({"command": "ls -la"})),
        "readfile" => Plan::tool("Reading a file.", "read_file", json!({"path": "seed.txt"})),
        "bash2" => Plan {
            text: vec!["I will run two commands.".into()],
            tools: vec![
                ToolCall {
                    name: "bash".into(),
                    arguments: json!({"command": "echo first >> first.txt"}),
                },
                ToolCall {
                    name: "bash".into(),
                    arguments: json!({"command": "echo second >> second.txt"}),
                },
            ],
            ..Plan::default()
        },
        "write" => Plan::tool(
            "I will write a file.",
            "write_file",
            json!({"path": "note.txt", "content": "hello\n"}),
        ),
        "slow" => Plan {
            text: (0..120).map(|i| format!("tick{i} ")).collect(),
            delay: Duration::from_millis(250),
            ..Plan::default()
        },
        "steady" => Plan {
            text: (0..24).map(|i| format!("step{i} ")).collect(),
            delay: Duration::from_millis(125),
            ..Plan::default()
        },
        "stall" => Plan {
            text: vec!["Finally".into(), " awake.".into()],
            initial_delay: Duration::from_secs(17),
            ..Plan::default()
        },
        "error" => Plan {
            error: true,
            ..Plan::default()
        },
        _ => Plan::text(&["OK."]),
    }
}

impl FakeLlm {
    /// Starts on 127.0.0.1:0.
    pub async fn start() -> FakeLlm {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let addr = crate::serve(Self::app(inner.clone())).await;
        FakeLlm {
            addr,
            inner,
            tls: false,
        }
    }

    /// Starts on 127.0.0.1:0 over TLS, with a certificate for 127.0.0.1 that `ca` signed.
    pub async fn start_tls(ca: &crate::tls::Ca) -> FakeLlm {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let (cert, key) = ca.issue(&["127.0.0.1"]);
        let addr = crate::serve_tls(Self::app(inner.clone()), &cert, &key).await;
        FakeLlm {
            addr,
            inner,
            tls: true,
        }
    }

    fn app(inner: Arc<Mutex<Inner>>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/messages", post(messages))
            .route(
                "/v1/models",
                get(|| async {
                    Json(json!({"object":"list","data":[{"id":"fake-model","object":"model"}]}))
                }),
            )
            .with_state(inner)
            // No keep-alive: the kernel's idle LLM connections would otherwise count as sockets
            // and tasks of the test process (the load tests count those for leaks).
            .layer(axum::middleware::map_response(
                |mut r: axum::response::Response| async move {
                    r.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                    r
                },
            ))
    }

    /// `http://127.0.0.1:<port>/v1` (`https://` over TLS)
    pub fn base_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}/v1", self.addr)
    }

    /// Registers (or replaces) the plan of a scenario marker.
    pub fn script(&self, scenario: &str, plan: Plan) {
        self.inner
            .lock()
            .expect("llm lock")
            .plans
            .insert(scenario.to_owned(), plan);
    }

    /// When the first text piece of each answer of `scenario` was sent, in order.
    pub fn first_texts(&self, scenario: &str) -> Vec<std::time::Instant> {
        let g = self.inner.lock().expect("llm lock");
        g.first_texts
            .iter()
            .filter(|(s, _)| s == scenario)
            .map(|(_, t)| *t)
            .collect()
    }

    /// Requests received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.lock().expect("llm lock").requests.clone()
    }
}

/// The selling pipeline's intent step: ask_user_question first, then complete_step with
/// `is_infra_intent: false` (an early, successful exit of the pipeline).
fn pipeline_plan(messages: &[Value], tools: &[String]) -> Plan {
    let calls: Vec<(String, String)> = messages
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .map(|tc| {
            (
                tc["id"].as_str().unwrap_or("").to_owned(),
                tc["function"]["name"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let last_tool = messages
        .last()
        .filter(|m| m["role"] == "tool")
        .and_then(|m| m["tool_call_id"].as_str())
        .and_then(|id| calls.iter().find(|(cid, _)| cid == id))
        .map(|(_, name)| name.clone());
    let asked = calls.iter().any(|(_, n)| n == "ask_user_question");
    if tools.iter().any(|t| t == "ask_user_question") && !asked {
        return Plan::tool(
            "I need one clarification.",
            "ask_user_question",
            json!({"question": "Which cloud target should be used?",
                   "options": [{"id": "alibaba", "label": "Alibaba Cloud"}, {"id": "none", "label": "Not a deployment request"}],
                   "allow_free_text": true}),
        );
    }
    if tools.iter().any(|t| t == "complete_step") && last_tool.as_deref() != Some("complete_step") {
        return Plan::tool(
            "Concluding the step.",
            "complete_step",
            json!({"conclusion": {"is_infra_intent": false, "category": "chat", "confidence": "high",
                   "rejection_reason": "The user confirmed this is not a deployment request.",
                   "user_message_summary": "greeting", "clarification_choice": "none"}}),
        );
    }
    Plan::text(&["Pipeline step finished."])
}

fn chunk(id: &str, delta: Value, finish: Option<&str>) -> Bytes {
    let v = json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    Bytes::from(format!("data: {v}\n\n"))
}

/// A request's messages and the scenario they name.
fn messages_of(body: &Value) -> (Vec<Value>, String) {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let scenario = scenario_of(&messages);
    (messages, scenario)
}

/// What is recorded of a request.
fn recorded(scenario: &str, body: &Value, headers: &HeaderMap) -> Recorded {
    Recorded {
        scenario: scenario.to_owned(),
        body: body.clone(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
    }
}

async fn completions(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let (messages, scenario) = messages_of(&body);
    let after_tool = messages
        .last()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        == Some("tool");
    let plan = {
        let mut g = inner.lock().expect("llm lock");
        g.requests.push(recorded(&scenario, &body, &headers));
        let tool_names: Vec<String> = body
            .get("tools")
            .and_then(Value::as_array)
            .map(|t| {
                t.iter()
                    .filter_map(|x| x["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if scenario == "pipeline" || tool_names.iter().any(|n| n == "complete_step") {
            pipeline_plan(&messages, &tool_names)
        } else if after_tool {
            let result = messages
                .last()
                .map(|m| content_text(m.get("content").unwrap_or(&Value::Null)))
                .unwrap_or_default();
            Plan::text(&[
                "Done. ",
                "The tool returned: ",
                result.trim().chars().take(200).collect::<String>().as_str(),
            ])
        } else {
            g.plans
                .get(&scenario)
                .cloned()
                .unwrap_or_else(|| builtin(&scenario))
        }
    };
    if plan.error {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error":{"message":"fake llm rejected the request","type":"invalid_request_error","code":"fake_error"}})),
        )
            .into_response();
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(16);
    let sent = inner.clone();
    tokio::spawn(async move {
        let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
        if !plan.initial_delay.is_zero() {
            tokio::time::sleep(plan.initial_delay).await;
        }
        let _ = tx
            .send(Ok(chunk(
                &id,
                json!({"role": "assistant", "content": ""}),
                None,
            )))
            .await;
        for r in &plan.reasoning {
            let _ = tx
                .send(Ok(chunk(&id, json!({"reasoning_content": r}), None)))
                .await;
        }
        for (i, t) in plan.text.iter().enumerate() {
            if !plan.delay.is_zero() {
                tokio::time::sleep(plan.delay).await;
            }
            if tx
                .send(Ok(chunk(&id, json!({"content": t}), None)))
                .await
                .is_err()
            {
                return;
            }
            if i == 0 {
                let now = std::time::Instant::now();
                sent.lock()
                    .expect("llm lock")
                    .first_texts
                    .push((scenario.clone(), now));
            }
        }
        let mut finish = "stop";
        for (i, tool) in plan.tools.iter().enumerate() {
            let call_id = format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
            let args = tool.arguments.to_string();
            let _ = tx
                .send(Ok(chunk(
                    &id,
                    json!({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                    "function": {"name": tool.name, "arguments": ""}}]}),
                    None,
                )))
                .await;
            let half = args.len() / 2;
            let (a, b) = args.split_at(half);
            for part in [a, b] {
                let _ = tx
                    .send(Ok(chunk(
                        &id,
                        json!({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                        None,
                    )))
                    .await;
            }
            finish = "tool_calls";
        }
        let _ = tx.send(Ok(chunk(&id, json!({}), Some(finish)))).await;
        let usage = json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": "fake-model", "choices": [],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}});
        let _ = tx.send(Ok(Bytes::from(format!("data: {usage}\n\n")))).await;
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .expect("response")
}

/// Anthropic's messages API, text only: the scenario's plan's text streamed as Anthropic's
/// events (`message_start` with the input's usage, a text block, `message_delta` with the
/// output's), or as one message when not streamed. Recorded as chat completions are.
async fn messages(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let (_, scenario) = messages_of(&body);
    let plan = {
        let mut g = inner.lock().expect("llm lock");
        g.requests.push(recorded(&scenario, &body, &headers));
        g.plans
            .get(&scenario)
            .cloned()
            .unwrap_or_else(|| builtin(&scenario))
    };
    let text: String = plan.text.concat();
    let usage_in = json!({"input_tokens": 100, "output_tokens": 1});
    if body.get("stream") != Some(&Value::Bool(true)) {
        return Json(
            json!({"id": "msg_fake", "type": "message", "role": "assistant",
            "model": "fake-model", "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 100, "output_tokens": 10}}),
        )
        .into_response();
    }
    let event = |name: &str, data: Value| Bytes::from(format!("event: {name}\ndata: {data}\n\n"));
    let mut events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message",
                "role": "assistant", "model": "fake-model", "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": usage_in}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
                "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    for piece in &plan.text {
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    events.push(event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"output_tokens": 10}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    let stream =
        futures_util::stream::iter(events.into_iter().map(Ok::<_, std::convert::Infallible>));
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("response")
}
