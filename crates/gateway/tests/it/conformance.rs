//! AG-UI client conformance: `@ag-ui/client` 1.0.0, 0.0.59 and 0.0.58 (Node, `conformance/run.mjs`)
//! consume the gateway's streams, against the real kernel and the fake kernel. The runner fails on
//! any client error or `[ag-ui]` warning, on a stream without exactly one terminal event, on
//! foreign thread/run ids, on a protocol version declared to the wrong client, on unexpected
//! outcomes, on messages of the client's agent (live or reloaded) that share an id, and on a
//! conversation that is not the one a step names (`"messages"`). Each client gets its own
//! expectations: the 1.0 client declares 1.0 and is told a cancellation as the `cancelled`
//! outcome; 0.0.x clients get `RUN_ERROR CANCELLED`.

use std::path::PathBuf;
use std::time::Duration;

use axum::body::Body;
use axum::routing::post as axum_post;
use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Stream};
use testkit::real_kernel::KernelEnv;

use crate::support::{bearer_for, ctx, jwks_file, jwt_server, last_report, managed, node, Builder};

pub const CLIENTS: [&str; 3] = ["1", "0059", "0058"];

/// The expectation of a step that ends cancelled, as `client` is told it.
fn cancelled(client: &str, mut step: Value) -> Value {
    if client == "1" {
        step["expect"] = json!("cancelled");
    } else {
        step["expect"] = json!("error");
        step["code"] = json!("CANCELLED");
    }
    step
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance")
}

/// Runs the Node runner with `plan`; returns (passed, report).
async fn runner(plan: Value) -> (bool, Value) {
    runner_with(plan, &[]).await
}

/// [`runner`] with variables of its own (`NODE_EXTRA_CA_CERTS` to trust a test's CA).
pub async fn runner_with(plan: Value, env: &[(&str, &str)]) -> (bool, Value) {
    let d = dir();
    assert!(
        CLIENTS
            .iter()
            .all(|c| d.join(format!("node_modules/agui-client-{c}")).is_dir()),
        "conformance clients are not installed: run `npm ci --prefix conformance` (scripts/test.sh does)"
    );
    let script = d.join("run.mjs");
    let env: Vec<_> = env
        .iter()
        .map(|(k, v)| (*k, std::ffi::OsStr::new(v)))
        .collect();
    let out = node(&[script.as_os_str()], &d, &env, &plan.to_string()).await;
    (out.status.success(), last_report(&out, "runner"))
}

pub fn plan(client: &str, url: &str, thread: &str, cwd: &str, steps: Value) -> Value {
    json!({"client": client, "url": url, "threadId": thread,
           "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": format!("inv-{thread}"), "cwd": cwd}},
           "steps": steps})
}

/// A step's `"messages"`: the conversation's messages in order, in run.mjs's notation (role,
/// `assistant+tools` for an assistant message with tool calls, then `: ` and its text, a prefix
/// when it ends with `*`).
fn messages(parts: &[&[&str]]) -> Value {
    json!(parts.concat())
}

/// `scenario:bash` up to its permission interrupt: the text and its tool call are one message.
const RUN: [&str; 2] = [
    "user: Run. scenario:bash",
    "assistant+tools: I will run a command.",
];
/// `scenario:bash2` up to its interrupts: one message with the text and both tool calls.
const TWO: [&str; 2] = [
    "user: Two. scenario:bash2",
    "assistant+tools: I will run two commands.",
];
const WRITE: [&str; 2] = [
    "user: Write. scenario:write",
    "assistant+tools: I will write a file.",
];
/// After the resume: the tool's result, then the answer as a message of its own.
const ANSWER: [&str; 2] = ["tool", "assistant: Done. The tool returned: *"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_clients_consume_real_kernel_streams() {
    let env = KernelEnv::new().await;
    // Users with JWTs, as a browser calling the gateway with its user's own token.
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    let s = jwt_server(&env, managed(&env).await, &jwks).await;
    for client in CLIENTS {
        let headers = json!({"authorization": bearer_for(&format!("user-{client}"))});
        let cwd = |t: &str| env.ws().join(t).display().to_string();
        let t = |name: &str| format!("{name}-{client}");
        let plans = vec![
            plan(
                client,
                &s.url,
                &t("plain"),
                &cwd(&t("plain")),
                json!([
                {"message": "Hello. scenario:text", "expect": "success"},
                {"message": "Think. scenario:think", "expect": "success"},
                {"message": "List. scenario:bashro", "expect": "success"},
                {"message": "Fail. scenario:error", "expect": "error", "code": "A2A_EXECUTION_FAILED"},
                {"connect": true, "expect": "success"}]),
            ),
            plan(
                client,
                &s.url,
                &t("allow"),
                &cwd(&t("allow")),
                // Every span of text its own message, live and reloaded: the answer after a
                // resume is not appended to the text before the tool call (the kernel names both
                // `<taskId>-message`).
                json!([
                {"message": "Run. scenario:bash", "expect": "interrupt", "messages": messages(&[&RUN])},
                {"connect": true, "expect": "interrupt", "messages": messages(&[&RUN])},
                {"resume": "allow_once", "expect": "success", "messages": messages(&[&RUN, &ANSWER])},
                {"connect": true, "expect": "success", "messages": messages(&[&RUN, &ANSWER])},
                {"message": "Two. scenario:bash2", "expect": "interrupt", "messages": messages(&[&RUN, &ANSWER, &TWO])},
                {"resume": "allow_once", "expect": "interrupt", "messages": messages(&[&RUN, &ANSWER, &TWO])},
                {"resume": "allow_once", "expect": "success", "messages": messages(&[&RUN, &ANSWER, &TWO, &["tool"], &ANSWER])},
                {"connect": true, "expect": "success", "messages": messages(&[&RUN, &ANSWER, &TWO, &["tool"], &ANSWER])}]),
            ),
            plan(
                client,
                &s.url,
                &t("deny"),
                &cwd(&t("deny")),
                json!([
                {"message": "Run. scenario:bash", "expect": "interrupt"},
                {"resume": "deny", "expect": "success", "messages": messages(&[&RUN, &ANSWER])},
                {"message": "Write. scenario:write", "expect": "interrupt"},
                {"resume": "cancelled", "expect": "success", "messages": messages(&[&RUN, &ANSWER, &WRITE, &ANSWER])},
                {"connect": true, "expect": "success", "messages": messages(&[&RUN, &ANSWER, &WRITE, &ANSWER])}]),
            ),
            plan(
                client,
                &s.url,
                &t("cancel"),
                &cwd(&t("cancel")),
                json!([
                cancelled(client, json!({"message": "Slow. scenario:slow", "cancel": true})),
                {"message": "Again. scenario:text", "expect": "success"}]),
            ),
        ];
        let mut pipeline = plan(
            client,
            &s.url,
            &t("pipeline"),
            &cwd(&t("pipeline")),
            json!([
            {"message": "Hello there. scenario:pipeline", "expect": "interrupt"},
            {"resume": {"selectedId": "none"}, "expect": "success"}]),
        );
        // A question (the pipeline's selection step) answered with free text, and one the user
        // cancels: the task is cancelled with it.
        let mut question = plan(
            client,
            &s.url,
            &t("question"),
            &cwd(&t("question")),
            json!([
            {"message": "Hello there. scenario:pipeline", "expect": "interrupt"},
            {"resume": {"freeText": "Just saying hi"}, "expect": "success"}]),
        );
        let mut dropped = plan(
            client,
            &s.url,
            &t("dropped"),
            &cwd(&t("dropped")),
            json!([
            {"message": "Hello there. scenario:pipeline", "expect": "interrupt"},
            cancelled(client, json!({"resume": "cancelled"}))]),
        );
        let mut plans = plans;
        for p in [&mut pipeline, &mut question, &mut dropped] {
            p["forwardedProps"]["iacCode"]["runMode"] = json!("pipeline");
            p["forwardedProps"]["iacCode"]["pipelineName"] = json!("selling");
        }
        plans.extend([pipeline, question, dropped]);
        for p in &mut plans {
            p["headers"] = headers.clone();
        }
        let results = futures_util::future::join_all(plans.into_iter().map(runner)).await;
        for (ok, report) in results {
            assert!(ok, "client {client}: {report:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_clients_consume_fake_kernel_streams() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    for client in CLIENTS {
        let thread = format!("rich-{client}");
        let c = ctx(&thread);
        let step = |seq: u64, t: &str| {
            json!({"schemaVersion":"1.0","eventId":format!("e{seq}"),"sequence":seq,"eventType":t,
            "scope":"step","step":{"id":"s1"},"data":{}})
        };
        k.stream(
            Stream::of("task-1", &c)
                .submitted(json!({"iacCodeSessionId": "sess"}))
                .working(json!({"pipeline": step(1, "step_started")}))
                .working(json!({"thinking": {"type": "raw_thinking", "text": "hmm"}}))
                .text("Hello", "m")
                .working(json!({"tool": {"status": "started", "toolUseId": "tu1", "name": "bash"}}))
                .working(json!({"tool": {"status": "progress", "toolUseId": "tu1", "name": "bash"}}))
                .working(json!({"tool": {"status": "input_complete", "toolUseId": "tu1", "name": "bash", "toolInput": {"c": "ls"}}}))
                .working(json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": "ok"}}))
                .artifact(json!({"artifactId": "a1", "name": "f"}))
                .working(json!({"pipeline": step(2, "stack_progress")}))
                .working(json!({"usage": {"inputTokens": 1.0, "outputTokens": 2.0, "totalTokens": 3.0}}))
                .input_required(json!({})),
        );
        k.stream(
            Stream::of("task-2", &c)
                .task("TASK_STATE_WORKING", json!({}))
                .text("partial", "m2")
                .then(Item::Sleep(Duration::from_millis(100)))
                .then(Item::Cut),
        );
        k.stream(
            Stream::of("task-3", &c)
                .task("TASK_STATE_WORKING", json!({}))
                .then(Item::Result(items::status(
                    "task-3",
                    "foreign-context",
                    "TASK_STATE_WORKING",
                    json!({}),
                ))),
        );
        // The kernel reports the task cancelled mid-message (cancelled elsewhere).
        k.stream(
            Stream::of("task-4", &c)
                .task("TASK_STATE_WORKING", json!({}))
                .text("partial", "m4")
                .status("TASK_STATE_CANCELED", json!({})),
        );
        let p = plan(
            client,
            &s.url,
            &thread,
            &s.ws(&thread),
            json!([
            {"message": "rich", "expect": "success"},
            {"message": "cut", "expect": "error", "code": "A2A_UNAVAILABLE"},
            {"message": "identity", "expect": "error", "code": "A2A_PROTOCOL_ERROR"},
            cancelled(client, json!({"message": "cancelled elsewhere"}))]),
        );
        let (ok, report) = runner(p).await;
        assert!(ok, "client {client}: {report:#}");
        let types = report["steps"][0]["types"].to_string();
        for t in [
            "STEP_STARTED",
            "REASONING_START",
            "TOOL_CALL_RESULT",
            "CUSTOM",
            "STEP_FINISHED",
        ] {
            assert!(types.contains(t), "{t} missing: {types}");
        }
    }
}

/// The runner itself fails on a broken stream (unbalanced span, no terminal event), for both clients.
#[tokio::test]
async fn runner_fails_on_a_broken_stream() {
    let app = axum::Router::new().route(
        "/",
        axum_post(|body: axum::body::Bytes| async move {
            let v: Value = serde_json::from_slice(&body).unwrap();
            let (t, r) = (v["threadId"].as_str().unwrap().to_owned(), v["runId"].as_str().unwrap().to_owned());
            let sse = format!(
                "data: {}\n\ndata: {}\n\ndata: {}\n\n",
                json!({"type":"RUN_STARTED","timestamp":1,"threadId":t,"runId":r}),
                json!({"type":"TEXT_MESSAGE_START","timestamp":2,"messageId":"m1","role":"assistant"}),
                json!({"type":"TEXT_MESSAGE_CONTENT","timestamp":3,"messageId":"m1","delta":"x"})
            );
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(Body::from(sse))
                .unwrap()
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    for client in CLIENTS {
        let (ok, report) = runner(plan(
            client,
            &url,
            "t",
            "/tmp",
            json!([{"message": "x", "expect": "success"}]),
        ))
        .await;
        assert!(!ok, "client {client} accepted a broken stream: {report:#}");
        let problems = report["problems"].to_string();
        assert!(problems.contains("terminal"), "{problems}");
    }
}

/// The runner's connect step fails when the connected agent's messages are not the live one's.
#[tokio::test]
async fn runner_fails_on_a_snapshot_that_differs() {
    let user_id = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = user_id.clone();
    let sse = |events: Vec<Value>| {
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(body))
            .unwrap()
    };
    let app = axum::Router::new()
        .route(
            "/",
            axum_post(move |body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    let (t, r) = (v["threadId"].clone(), v["runId"].clone());
                    *seen.lock().unwrap() = v["messages"][0]["id"].as_str().unwrap().to_owned();
                    sse(vec![
                        json!({"type":"RUN_STARTED","timestamp":1,"threadId":t,"runId":r}),
                        json!({"type":"TEXT_MESSAGE_START","timestamp":2,"messageId":"m1","role":"assistant"}),
                        json!({"type":"TEXT_MESSAGE_CONTENT","timestamp":3,"messageId":"m1","delta":"live"}),
                        json!({"type":"TEXT_MESSAGE_END","timestamp":4,"messageId":"m1"}),
                        json!({"type":"RUN_FINISHED","timestamp":5,"threadId":t,"runId":r}),
                    ])
                }
            }),
        )
        .route(
            "/threads/t/connect",
            axum::routing::get(move || {
                let id = user_id.lock().unwrap().clone();
                async move {
                    sse(vec![
                        json!({"type":"RUN_STARTED","timestamp":1,"threadId":"t","runId":"c"}),
                        json!({"type":"MESSAGES_SNAPSHOT","timestamp":2,"messages":[
                            {"id": id, "role": "user", "content": "x"},
                            {"id": "m1", "role": "assistant", "content": "other"}]}),
                        json!({"type":"RUN_FINISHED","timestamp":3,"threadId":"t","runId":"c"}),
                    ])
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    // The 0.0.x clients only: the 1.0 client requires a declared protocol version of this server.
    for client in ["0059", "0058"] {
        let (ok, report) = runner(plan(
            client,
            &url,
            "t",
            "/tmp",
            json!([{"message": "x", "expect": "success"}, {"connect": true, "expect": "success"}]),
        ))
        .await;
        assert!(
            !ok,
            "client {client} accepted a differing snapshot: {report:#}"
        );
        let problems = report["problems"].to_string();
        assert!(problems.contains("texts differ"), "{problems}");
    }
}

/// The runner fails when a later run starts its text under an id the thread already has (what the
/// gateway did with the kernel's `<taskId>-message` after a resume): the client appends it to the
/// earlier message, so the step's `"messages"` differ, and a snapshot listing both under one id
/// gives the reloaded agent two messages of one id. The same server naming the second text
/// `m1-2` passes, for every client.
#[tokio::test]
async fn runner_fails_on_a_repeated_message_id() {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    // Each thread's messages as the server sent them: its snapshot on connect.
    let transcripts: Arc<Mutex<HashMap<String, Vec<Value>>>> = Arc::default();
    let sse = |events: Vec<Value>| {
        let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(body))
            .unwrap()
    };
    let started = |t: &Value, r: &Value, declared: bool| {
        let mut e = json!({"type":"RUN_STARTED","timestamp":1,"threadId":t,"runId":r});
        if declared {
            e["protocolVersion"] = json!("1.0");
        }
        e
    };
    let posted = transcripts.clone();
    let connected = transcripts;
    let app = axum::Router::new()
        .route(
            "/",
            axum_post(move |body: axum::body::Bytes| {
                let posted = posted.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap();
                    let (t, r) = (v["threadId"].clone(), v["runId"].clone());
                    let thread = t.as_str().unwrap().to_owned();
                    let mut all = posted.lock().unwrap();
                    let transcript = all.entry(thread.clone()).or_default();
                    transcript.push(v["messages"].as_array().unwrap().last().unwrap().clone());
                    let (id, text) = match transcript.len() {
                        1 => ("m1", "first"),
                        _ if thread.starts_with("repeat") => ("m1", "second"),
                        _ => ("m1-2", "second"),
                    };
                    transcript.push(json!({"id": id, "role": "assistant", "content": text}));
                    sse(vec![
                        started(&t, &r, v.get("protocolVersion").is_some()),
                        json!({"type":"TEXT_MESSAGE_START","timestamp":2,"messageId":id,"role":"assistant"}),
                        json!({"type":"TEXT_MESSAGE_CONTENT","timestamp":3,"messageId":id,"delta":text}),
                        json!({"type":"TEXT_MESSAGE_END","timestamp":4,"messageId":id}),
                        json!({"type":"RUN_FINISHED","timestamp":5,"threadId":t,"runId":r}),
                    ])
                }
            }),
        )
        .route(
            "/threads/{thread}/connect",
            axum::routing::get(
                move |axum::extract::Path(thread): axum::extract::Path<String>,
                      axum::extract::Query(q): axum::extract::Query<HashMap<String, String>>| {
                    let messages = connected.lock().unwrap()[&thread].clone();
                    async move {
                        let t = json!(thread);
                        sse(vec![
                            started(&t, &json!("c"), q.contains_key("protocolVersion")),
                            json!({"type":"MESSAGES_SNAPSHOT","timestamp":2,"messages":messages}),
                            json!({"type":"RUN_FINISHED","timestamp":3,"threadId":t,"runId":"c"}),
                        ])
                    }
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let both = [
        "user: x",
        "assistant: first",
        "user: y",
        "assistant: second",
    ];
    let steps = json!([
        {"message": "x", "expect": "success", "messages": ["user: x", "assistant: first"]},
        {"message": "y", "expect": "success", "messages": both},
        {"connect": true, "expect": "success", "messages": both}]);
    for client in CLIENTS {
        let thread = format!("distinct-{client}");
        let (ok, report) = runner(plan(client, &url, &thread, "/tmp", steps.clone())).await;
        assert!(ok, "client {client}: {report:#}");

        let thread = format!("repeat-{client}");
        let (ok, report) = runner(plan(client, &url, &thread, "/tmp", steps.clone())).await;
        assert!(
            !ok,
            "client {client} accepted a repeated message id: {report:#}"
        );
        let problems: Vec<String> = serde_json::from_value(report["problems"].clone()).unwrap();
        // The live agent appended the second text to the first message.
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("step 1: messages are")
                    && p.contains(r#""assistant: firstsecond""#)),
            "client {client}: {problems:#?}"
        );
        // The reloaded agent has both messages under one id.
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("step 2 (connect): messages share the id m1")),
            "client {client}: {problems:#?}"
        );
    }
}
