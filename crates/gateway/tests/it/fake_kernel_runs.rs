//! Runs against the scriptable fake kernel: mapping, every RUN_ERROR path, faults, cancellation,
//! disconnects, interrupts, resumes and expiry. Each stream must be valid (one terminal event,
//! balanced spans).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use iac_code_agui::run::OffsetClock;
use iac_code_agui::store::FileStore;

use crate::support::FaultyStore;
use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Reply};
use testkit::sse::{assert_valid_run, post};

use crate::support::{body, ctx, resume_body, Builder, TestServer};

async fn setup() -> (TestServer, FakeKernel) {
    let k = FakeKernel::start().await;
    let s = Builder::new()
        .a2a(&k.url(), Some("a2a-secret"))
        .start()
        .await;
    (s, k)
}

fn r(v: Value) -> Item {
    Item::Result(v)
}

#[tokio::test]
async fn full_turn_mapping_and_request_shape() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    k.on("SendStreamingMessage", Reply::Sse(vec![
        r(items::task("task-1", &c, "TASK_STATE_SUBMITTED", json!({"iacCodeSessionId": "sess-1"}))),
        r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"thinking": {"type": "raw_thinking", "text": "hmm"}}))),
        r(items::text("task-1", &c, "Hello ", "msg-a", json!({}))),
        Item::Raw(": ping - 2026-11-29 19:00:00\r\n\r\n".into()),
        r(items::text("task-1", &c, "world", "msg-a", json!({}))),
        r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"tool": {"status": "input_complete", "toolUseId": "tu1", "name": "read", "toolInput": {"path": "a", "b": 1}}}))),
        r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": {"ok": true}}}))),
        r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"usage": {"provider": "p", "model": "m", "inputTokens": 10.0, "outputTokens": 5.0, "totalTokens": 15.0}}))),
        r(items::artifact("task-1", &c, json!({"artifactId": "a1", "name": "f.txt"}))),
        r(json!({"statusUpdate": {"taskId": "task-1", "contextId": c, "status": {"state": "TASK_STATE_WORKING",
            "message": {"role": "ROLE_AGENT", "parts": [{"text": "Hello world"}], "messageId": "task-1-2"}},
            "metadata": {"iac_code": {"assistantFinal": {"complete": true}}}}})),
        r(items::status("task-1", &c, "TASK_STATE_INPUT_REQUIRED", json!({}))),
    ]));
    let b = body(
        "t1",
        "r1",
        "hello",
        &s.ws("w"),
        json!({"model": " qwen ", "llmApiKey": " k ", "llmHeaders": {"X-A": "b"},
        "thinking": {"enabled": true, "effort": " high ", "budget": 5}, "userId": "u", "channel": "c", "candidatePresentation": "rich",
        "runMode": "pipeline", "pipelineName": "selling", "cleanupOnly": true, "preferredLanguage": "zh-CN",
        "alibabaCloud": {"accessKeyId": "id", "accessKeySecret": "sec", "securityToken": "tok", "regionId": "cn-hangzhou"}}),
    );
    let mut b = b;
    b["parentRunId"] = json!("r0");
    let res = post(&s.url, &b, &[]).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.content_type, "text/event-stream; charset=utf-8");
    assert!(res
        .headers
        .iter()
        .any(|(k, v)| k == "cache-control" && v == "no-cache"));
    assert!(res
        .headers
        .iter()
        .any(|(k, v)| k == "x-accel-buffering" && v == "no"));
    assert_eq!(
        res.types(),
        [
            "RUN_STARTED",
            "CUSTOM(iac-code.session.v1)",
            "CUSTOM(iac-code.session.v1)",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "REASONING_MESSAGE_END",
            "REASONING_END",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "CUSTOM(iac-code.artifact.v1)",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED",
        ]
    );
    assert_eq!(res.events[0]["parentRunId"], "r0");
    assert!(res.events[0].get("input").is_none());
    let sessions = res.sessions();
    assert_eq!(sessions[0]["taskId"], Value::Null);
    assert_eq!(sessions[1]["taskId"], "task-1");
    assert_eq!(sessions[1]["sessionId"], "sess-1");
    assert_eq!(sessions[1]["contextId"], ctx("t1"));
    assert_eq!(res.last()["outcome"], json!({"type": "success"}));
    assert_eq!(
        res.last()["usage"],
        json!([{"provider":"p","model":"m","inputTokens":10,"outputTokens":5,"totalTokens":15,"cachedInputTokens":0}])
    );
    // The kernel request.
    let call = &k.calls("SendStreamingMessage")[0];
    assert_eq!(call.headers["a2a-version"], "1.0");
    assert_eq!(call.headers["authorization"], "Bearer a2a-secret");
    let p = &call.body["params"];
    assert_eq!(
        p["configuration"],
        json!({"acceptedOutputModes": ["text/plain"]})
    );
    assert_eq!(p["message"]["role"], "ROLE_USER");
    assert_eq!(p["message"]["messageId"], "msg-r1");
    assert_eq!(p["message"]["contextId"], ctx("t1"));
    assert!(p["message"].get("taskId").is_none());
    assert_eq!(p["message"]["parts"], json!([{"text": "hello"}]));
    assert_eq!(
        p["message"]["metadata"]["iac_code"],
        json!({"user_id":"u","channel":"c","preferredLanguage":"zh",
        "candidatePresentation":"rich-v1","run_mode":"pipeline","pipeline_name":"selling","cleanupOnly":true,"rosInvocationId":"inv-1",
        "llm_headers":{"X-A":"b"},"alibaba_cloud_access_key_id":"id","alibaba_cloud_access_key_secret":"sec",
        "alibaba_cloud_security_token":"tok","alibaba_cloud_region_id":"cn-hangzhou","cwd":s.ws("w"),"iac_code_model":"qwen",
        "iac_code_api_key":"k","thinking":{"enabled":true,"effort":"high","budget":5}})
    );
    // State after the run: terminal, task id cleared, session kept.
    let doc = s.thread_doc("t1");
    assert_eq!(doc["iacCodeSessionId"], "sess-1");
    assert_eq!(doc["execution"]["taskId"], Value::Null);
    assert_eq!(
        doc["terminalExecutionIds"][0],
        doc["execution"]["executionId"]
    );
}

#[tokio::test]
async fn minimal_metadata_and_accept_language() {
    let (s, k) = setup().await;
    let res = post(
        &s.url,
        &body("t1", "r1", "x", &s.ws("w"), json!({})),
        &[("accept-language", "fr")],
    )
    .await;
    assert_valid_run(&res, "t1", "r1");
    let meta =
        &k.calls("SendStreamingMessage")[0].body["params"]["message"]["metadata"]["iac_code"];
    assert_eq!(
        meta,
        &json!({"preferredLanguage":"fr","cleanupOnly":false,"rosInvocationId":"inv-1","cwd":s.ws("w")})
    );
    // An empty stream: A2A_EXECUTION_FAILED, translated.
    assert_eq!(res.last()["code"], "A2A_EXECUTION_FAILED");
    assert_ne!(res.last()["message"], "The A2A execution failed.");
}

async fn run_with(items: Vec<Item>) -> (testkit::sse::RunResult, FakeKernel, TestServer) {
    let (s, k) = setup().await;
    k.on("SendStreamingMessage", Reply::Sse(items));
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_valid_run(&res, "t1", "r1");
    (res, k, s)
}

#[tokio::test]
async fn terminal_states_and_errors() {
    let c = ctx("t1");
    let start = || {
        r(items::task(
            "task-1",
            &ctx("t1"),
            "TASK_STATE_SUBMITTED",
            json!({"iacCodeSessionId": "s"}),
        ))
    };
    for (state, code) in [
        ("TASK_STATE_CANCELED", "CANCELLED"),
        ("TASK_STATE_FAILED", "A2A_EXECUTION_FAILED"),
        ("TASK_STATE_AUTH_REQUIRED", "A2A_EXECUTION_FAILED"),
        ("TASK_STATE_REJECTED", "A2A_EXECUTION_FAILED"),
        ("TASK_STATE_WORKING", "A2A_EXECUTION_FAILED"),
    ] {
        let (res, _, _) = run_with(vec![
            start(),
            r(items::text("task-1", &c, "partial", "m", json!({}))),
            r(items::status("task-1", &c, state, json!({}))),
        ])
        .await;
        assert_eq!(res.last()["type"], "RUN_ERROR", "{state}");
        assert_eq!(res.last()["code"], code, "{state}");
        // Spans were balanced first.
        let n = res.types().len();
        assert_eq!(res.types()[n - 2], "TEXT_MESSAGE_END");
    }
    let (res, _, _) = run_with(vec![
        start(),
        r(items::status(
            "task-1",
            &c,
            "TASK_STATE_COMPLETED",
            json!({}),
        )),
    ])
    .await;
    assert_eq!(res.last()["outcome"]["type"], "success");
}

#[tokio::test]
async fn identity_changes_are_protocol_errors() {
    let c = ctx("t1");
    let start = || {
        r(items::task(
            "task-1",
            &ctx("t1"),
            "TASK_STATE_SUBMITTED",
            json!({"iacCodeSessionId": "s"}),
        ))
    };
    for (item, message) in [
        (
            items::status("task-1", "other", "TASK_STATE_WORKING", json!({})),
            "The A2A context identity changed unexpectedly.",
        ),
        (
            items::status("task-2", &c, "TASK_STATE_WORKING", json!({})),
            "The A2A task identity changed unexpectedly.",
        ),
        (
            items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"iacCodeSessionId": "s2"}),
            ),
            "The iac-code session identity changed unexpectedly.",
        ),
    ] {
        let (res, k, _) = run_with(vec![
            start(),
            r(items::text("task-1", &c, "a", "m", json!({}))),
            r(item),
            Item::Stall,
        ])
        .await;
        assert_eq!(res.last()["code"], "A2A_PROTOCOL_ERROR");
        assert_eq!(res.last()["message"], message);
        // Nothing is left running.
        assert_eq!(
            k.wait_calls("CancelTask", 1, Duration::from_secs(5))
                .await
                .len(),
            1
        );
    }
}

#[tokio::test]
async fn kernel_faults_end_with_a2a_unavailable_and_cancel() {
    let c = ctx("t1");
    let start = || {
        r(items::task(
            "task-1",
            &ctx("t1"),
            "TASK_STATE_SUBMITTED",
            json!({"iacCodeSessionId": "s"}),
        ))
    };
    let cases: Vec<(Vec<Item>, &str)> = vec![
        (vec![start(), r(items::text("task-1", &c, "a", "m", json!({}))), Item::Sleep(Duration::from_millis(200)), Item::Cut], "cut"),
        (vec![start(), Item::Raw("data: {not json\r\n\r\n".into())], "malformed"),
        (vec![start(), Item::Raw("data: {\"jsonrpc\":\"2.0\",\"id\":\"rpc-1\",\"error\":{\"code\":-32603,\"message\":\"boom\"}}\r\n\r\n".into())], "rpc error item"),
    ];
    for (items, what) in cases {
        let (res, k, _) = run_with(items).await;
        assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{what}");
        assert_eq!(
            res.last()["message"],
            "The local A2A execution service is unavailable."
        );
        // The JSON-RPC id is never adopted as a task id.
        assert!(res.sessions().iter().all(|s| s["taskId"] != "rpc-1"));
        let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
        assert_eq!(cancels[0].body["params"]["id"], "task-1", "{what}");
    }
    // A JSON-RPC error body where a stream was expected, and backup-not-ready.
    let (s, k) = setup().await;
    k.on(
        "SendStreamingMessage",
        Reply::Json(
            200,
            json!({"error": {"code": -32602, "message": "Unsupported run mode."}}),
        ),
    );
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    k.on("SendStreamingMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "Session backup is still synchronizing. Retry after 3 seconds.",
        "data": {"code": "SESSION_BACKUP_NOT_READY", "retryable": true}}})));
    let res = post(&s.url, &body("t1", "r2", "x", &s.ws("w"), json!({})), &[]).await;
    assert_eq!(res.last()["code"], "SESSION_BACKUP_NOT_READY");
    // Kernel down.
    let s = Builder::new()
        .a2a("http://127.0.0.1:9/", None)
        .start()
        .await;
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
}

#[tokio::test]
async fn heartbeat_after_silence() {
    let k = FakeKernel::start().await;
    let s = Builder::new()
        .a2a(&k.url(), None)
        .heartbeat(Duration::from_millis(300))
        .start()
        .await;
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task("task-1", &c, "TASK_STATE_SUBMITTED", json!({}))),
            Item::Sleep(Duration::from_millis(1000)),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({}),
            )),
        ]),
    );
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_valid_run(&res, "t1", "r1");
    assert!(res.heartbeats >= 2, "{}", res.raw);
    assert!(res.raw.contains("\n\n: heartbeat\n\n"));
}

#[tokio::test]
async fn client_disconnect_cancels_the_task() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            Item::Stall,
        ]),
    );
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = client
        .post(&s.url)
        .header("content-type", "application/json")
        .body(body("t1", "r1", "x", &s.ws("w"), json!({})).to_string())
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    use futures_util::StreamExt;
    let _ = stream.next().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(stream);
    let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    assert_eq!(cancels.len(), 1, "disconnect must cancel the kernel task");
    assert_eq!(cancels[0].body["params"]["id"], "task-1");
    // The thread is released and the execution terminal.
    tokio::time::sleep(Duration::from_millis(100)).await;
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let res = post(&s.url, &body("t1", "r2", "x", &s.ws("w"), json!({})), &[]).await;
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn cancel_extension_during_a_run() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"iacCodeSessionId": "s"}),
            )),
            r(items::text("task-1", &c, "tick", "m", json!({}))),
            Item::Sleep(Duration::from_millis(800)),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_CANCELED",
                json!({}),
            )),
        ]),
    );
    let url = s.url.clone();
    let b = body("t1", "r1", "x", &s.ws("w"), json!({}));
    let run = tokio::spawn(async move { post(&url, &b, &[]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exec = s.thread_doc("t1")["execution"]["executionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let r1 = post(
        &s.cancel_url(&exec),
        &json!({"threadId": "t1", "rosInvocationId": "nope"}),
        &[],
    )
    .await;
    assert_eq!(
        (r1.status, r1.error_code()),
        (404, Some("EXECUTION_NOT_FOUND"))
    );
    let r1 = post(
        &s.cancel_url(&exec),
        &json!({"threadId": "t1", "rosInvocationId": "inv-1", "x": 1}),
        &[],
    )
    .await;
    assert_eq!(
        r1.json.unwrap(),
        json!({"executionId": exec, "status": "cancelled"})
    );
    assert_eq!(k.calls("CancelTask")[0].body["params"]["id"], "task-1");
    let res = run.await.unwrap();
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["code"], "CANCELLED");
    let r2 = post(
        &s.cancel_url(&exec),
        &json!({"threadId": "t1", "rosInvocationId": "whatever"}),
        &[],
    )
    .await;
    assert_eq!(r2.json.unwrap()["status"], "already_terminal");
    let r3 = post(
        &s.cancel_url("zzz"),
        &json!({"threadId": "t1", "rosInvocationId": "inv-1"}),
        &[],
    )
    .await;
    assert_eq!(r3.status, 404);
}

fn perm(id: &str, tool: &str, thread: &str) -> Value {
    json!({"schemaVersion":1.0,"kind":"permission","requestTaskId":"task-1","contextId":ctx(thread),"inputId":id,"toolUseId":tool,
        "toolName":"bash","prompt":"Run bash Allow once?","title":"Run bash","options":[{"id":"allow_once","label":"Allow once"},{"id":"deny","label":"Deny"}],
        "language":"en","required":true,"secretThing":"zzz"})
}

async fn interrupted(s: &TestServer, k: &FakeKernel, input: Value) -> testkit::sse::RunResult {
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_SUBMITTED",
                json!({"iacCodeSessionId": "sess-1"}),
            )),
            r(items::text("task-1", &c, "Let me run", "m-a", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"tool": {"status": "started", "toolUseId": "tu1", "name": "bash"}}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": input}),
            )),
        ]),
    );
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_valid_run(&res, "t1", "r1");
    res
}

#[tokio::test]
async fn permission_interrupt_and_resume() {
    let (s, k) = setup().await;
    let res = interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    let t = res.types();
    assert_eq!(
        t[t.len() - 3..],
        ["TOOL_CALL_END", "TEXT_MESSAGE_END", "RUN_FINISHED"]
    );
    let last = res.last();
    let i = &last["outcome"]["interrupts"][0];
    assert_eq!(last["outcome"]["type"], "interrupt");
    assert_eq!(i["id"], "perm-1");
    assert_eq!(i["reason"], "tool_call");
    assert_eq!(i["message"], "Run bash Allow once?");
    assert_eq!(i["toolCallId"], "tu1");
    assert_eq!(i["responseSchema"]["required"], json!(["decision"]));
    assert!(i["expiresAt"].as_str().unwrap().ends_with('Z'));
    assert!(i["metadata"].get("secretThing").is_none());
    let doc = s.thread_doc("t1");
    assert_eq!(doc["execution"]["pending"]["perm-1"]["sideband"], false);
    assert!(doc["execution"]["pending"]["perm-1"]["expiresAt"].is_string());
    assert_eq!(
        doc["execution"]["textSnapshotDigests"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // Disconnecting after an interrupt cancelled nothing.
    assert!(k.calls("CancelTask").is_empty());

    // Invalid payload: RUN_ERROR, nothing sent, retryable.
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &ctx("t1"),
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": perm("perm-1", "tu1", "t1")}),
            ),
        ),
    );
    let bad = resume_body(
        "t1",
        "r2",
        &s.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "maybe"}}]),
    );
    let res = post(&s.url, &bad, &[]).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "RESUME_PAYLOAD_INVALID");
    assert_eq!(k.calls("SendStreamingMessage").len(), 1);
    assert_eq!(
        k.requests()
            .iter()
            .filter(|r| r.path == "/iac-code/session/ensure-restored")
            .count(),
        1
    );
    for (entries, code) in [
        (json!([]), "INCOMPLETE_RESUME"),
        (
            json!([{"interruptId": "perm-1", "status": "resolved"}]),
            "RESUME_PAYLOAD_INVALID",
        ),
        (
            json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}, {"interruptId": "zzz", "status": "cancelled"}]),
            "UNKNOWN_INTERRUPT",
        ),
        (
            json!([{"interruptId": "perm-1", "status": "cancelled"}, {"interruptId": "perm-1", "status": "cancelled"}]),
            "INCOMPLETE_RESUME",
        ),
    ] {
        k.on(
            "GetTask",
            Reply::Json(
                200,
                items::bare_task(
                    "task-1",
                    &ctx("t1"),
                    "TASK_STATE_INPUT_REQUIRED",
                    json!({"input": perm("perm-1", "tu1", "t1")}),
                ),
            ),
        );
        let run = format!("r-{code}-{}", entries.as_array().unwrap().len());
        let res = post(
            &s.url,
            &resume_body("t1", &run, &s.ws("w"), "inv-1", entries),
            &[],
        )
        .await;
        assert_valid_run(&res, "t1", &run);
        assert_eq!(res.last()["code"], code);
    }
    // Valid resume.
    let c = ctx("t1");
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": perm("perm-1", "tu1", "t1")}),
            ),
        ),
    );
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"inputReceived": {"kind": "permission", "inputId": "perm-1"}}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": "ok"}}),
            )),
            r(items::text(
                "task-1",
                &c,
                "Let me run. Done",
                "m-a",
                json!({}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({}),
            )),
        ]),
    );
    let good = resume_body(
        "t1",
        "r6",
        &s.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]),
    );
    let res = post(&s.url, &good, &[]).await;
    assert_valid_run(&res, "t1", "r6");
    assert_eq!(res.last()["outcome"]["type"], "success");
    let delta: Vec<&Value> = res.of("TEXT_MESSAGE_CONTENT");
    assert_eq!(delta[0]["delta"], ". Done", "replayed prefix trimmed");
    assert!(res.types().contains(&"TOOL_CALL_RESULT".to_owned()));
    let sent = &k.calls("SendStreamingMessage")[1].body["params"]["message"];
    assert_eq!(sent["messageId"], "agui-resume-r6-perm-1");
    assert_eq!(sent["taskId"], "task-1");
    assert_eq!(
        sent["parts"],
        json!([{"data": {"schemaVersion": 1, "kind": "permission", "requestTaskId": "task-1", "inputId": "perm-1", "toolUseId": "tu1", "decision": "allow_once"}, "mediaType": "application/json"}])
    );
    let doc = s.thread_doc("t1");
    assert_eq!(doc["execution"]["pending"], json!({}));
    assert_eq!(
        doc["appliedResumeDigests"][0]["digest"],
        "289281c743b2a91d60f25b59680f04683bd82766f7a9b2eb405975140373868e"
    );
    // Replayed accepted answer: RESUME_ALREADY_APPLIED, no second delivery.
    let again = resume_body(
        "t1",
        "r7",
        &s.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]),
    );
    let res = post(&s.url, &again, &[]).await;
    assert_eq!(res.last()["code"], "RESUME_ALREADY_APPLIED");
    let other = resume_body(
        "t1",
        "r8",
        &s.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "deny"}}]),
    );
    let res = post(&s.url, &other, &[]).await;
    assert_eq!(res.last()["code"], "EXECUTION_LOST");
    assert_eq!(k.calls("SendStreamingMessage").len(), 2);
}

#[tokio::test]
async fn question_with_options_and_free_text() {
    let (s, k) = setup().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-1", "toolUseId": "tu-q", "prompt": "Which region?", "requestTaskId": "task-1",
        "options": [{"id": "a", "label": "Hangzhou"}, {"id": "b", "label": "Beijing"}], "allowFreeText": true, "required": true});
    let res = interrupted(&s, &k, q.clone()).await;
    let i = &res.last()["outcome"]["interrupts"][0];
    assert_eq!(i["reason"], "input_required");
    assert_eq!(i["message"], "Which region?\n- a: Hangzhou\n- b: Beijing");
    assert_eq!(i["responseSchema"]["oneOf"].as_array().unwrap().len(), 3);
    let c = ctx("t1");
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": q}),
            ),
        ),
    );
    let res = post(&s.url, &resume_body("t1", "r2", &s.ws("w"), "inv-1", json!([{"interruptId": "q-1", "status": "resolved", "payload": {"selectedId": "a", "freeText": "x"}}])), &[]).await;
    assert_eq!(res.last()["code"], "RESUME_PAYLOAD_INVALID");
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": q}),
            ),
        ),
    );
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    let res = post(
        &s.url,
        &resume_body(
            "t1",
            "r3",
            &s.ws("w"),
            "inv-1",
            json!([{"interruptId": "q-1", "status": "resolved", "payload": {"selectedId": "a"}}]),
        ),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r3");
    let sent = &k.calls("SendStreamingMessage")[1].body["params"]["message"];
    assert_eq!(sent["parts"], json!([{"text": "Hangzhou"}]));
    assert_eq!(sent["messageId"], "agui-resume-r3");
    let tr = res.of("TOOL_CALL_RESULT");
    assert_eq!(tr[0]["toolCallId"], "tu-q");
    assert_eq!(tr[0]["content"], "Hangzhou");
}

#[tokio::test]
async fn question_cancelled_cancels_the_task() {
    let (s, k) = setup().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-2", "prompt": "Anything?", "required": true});
    interrupted(&s, &k, q.clone()).await;
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &ctx("t1"),
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": q}),
            ),
        ),
    );
    let res = post(
        &s.url,
        &resume_body(
            "t1",
            "r2",
            &s.ws("w"),
            "inv-1",
            json!([{"interruptId": "q-2", "status": "cancelled"}]),
        ),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "CANCELLED");
    assert_eq!(
        res.last()["message"],
        "The execution was cancelled by the interrupt response."
    );
    assert_eq!(k.calls("CancelTask")[0].body["params"]["id"], "task-1");
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let res = post(
        &s.url,
        &body("t1", "r3", "next", &s.ws("w"), json!({})),
        &[],
    )
    .await;
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn session_restore_failures_keep_pending() {
    let (s, k) = setup().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    k.on(
        "ensure-restored",
        Reply::Json(404, json!({"status": "not_found"})),
    );
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries.clone()),
        &[],
    )
    .await;
    assert_eq!(res.last()["code"], "EXECUTION_LOST");
    assert_eq!(
        res.last()["message"],
        "The iac-code session to resume is unavailable."
    );
    k.on("ensure-restored", Reply::Json(409, json!({"error": {"code": "SESSION_BACKUP_NOT_READY", "message": "Session backup is still synchronizing. Retry after 3 seconds.", "retryable": true}})));
    let res = post(
        &s.url,
        &resume_body("t1", "r3", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_eq!(res.last()["code"], "SESSION_BACKUP_NOT_READY");
    assert!(s.thread_doc("t1")["execution"]["pending"]["perm-1"].is_object());
    assert!(k.calls("CancelTask").is_empty());
}

#[tokio::test]
async fn interrupt_expiry() {
    let k = FakeKernel::start().await;
    let clock = Arc::new(OffsetClock::default());
    let s = Builder::new()
        .a2a(&k.url(), None)
        .clock(clock.clone())
        .ttl(60)
        .start()
        .await;
    let res = interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    assert!(res.last()["outcome"]["interrupts"][0]["expiresAt"].is_string());
    clock.offset_ms.store(61_000, Ordering::SeqCst);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries.clone()),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "EXECUTION_EXPIRED");
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    assert_eq!(
        k.wait_calls("CancelTask", 1, Duration::from_secs(5))
            .await
            .len(),
        1
    );
    // Remembered: answering again is still EXECUTION_EXPIRED; a new turn works.
    let res = post(
        &s.url,
        &resume_body("t1", "r3", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_eq!(res.last()["code"], "EXECUTION_EXPIRED");
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let res = post(&s.url, &body("t1", "r4", "x", &s.ws("w"), json!({})), &[]).await;
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn failed_recovery_critical_writes_fail_closed() {
    // Task id write, then interrupt commit.
    for (skip, message) in [
        (1u32, "The execution mapping could not be committed."),
        (3, "The interrupted execution state could not be committed."),
    ] {
        let k = FakeKernel::start().await;
        let dir = tempfile::tempdir().unwrap();
        let (store, switch) =
            FaultyStore::new(FileStore::open(dir.path().join("state")).expect("store"));
        let s = Builder::new()
            .a2a(&k.url(), None)
            .store(Arc::new(store))
            .start()
            .await;
        switch.fail_saves(skip, 1);
        let res = interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
        assert_eq!(res.last()["code"], "STATE_PERSISTENCE_FAILED");
        assert_eq!(res.last()["message"], message);
        // The client never saw an interrupt that was not durable.
        assert!(res.of("RUN_FINISHED").is_empty());
        assert_eq!(
            k.wait_calls("CancelTask", 1, Duration::from_secs(5))
                .await
                .len(),
            1
        );
    }
}

/// A slow client slows its kernel stream: the gateway buffers a bounded number of events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_backpressure_bounds_memory() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    let n = 100_000;
    let mut script = vec![r(items::task(
        "task-1",
        &c,
        "TASK_STATE_WORKING",
        json!({"iacCodeSessionId": "s"}),
    ))];
    let chunk = "x".repeat(200);
    for _ in 0..n {
        script.push(r(items::text("task-1", &c, &chunk, "m", json!({}))));
    }
    script.push(r(items::status(
        "task-1",
        &c,
        "TASK_STATE_INPUT_REQUIRED",
        json!({}),
    )));
    k.on("SendStreamingMessage", Reply::Sse(script));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = client
        .post(&s.url)
        .header("content-type", "application/json")
        .body(body("t1", "r1", "x", &s.ws("w"), json!({})).to_string())
        .send()
        .await
        .unwrap();
    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    // The client stops reading for a while: the kernel must be held back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let written = k.items_written();
    eprintln!("items written by the kernel while the client paused: {written} of {n}");
    assert!(
        written < n / 2,
        "no backpressure: {written} of {n} items consumed while the client was paused"
    );
    // Then everything arrives and the run completes.
    let mut raw = String::from_utf8_lossy(&first).into_owned();
    while let Some(b) = stream.next().await {
        raw.push_str(&String::from_utf8_lossy(&b.unwrap()));
    }
    let (events, _) = testkit::sse::parse(&raw);
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
            .count(),
        n
    );
    assert_eq!(events.last().unwrap()["type"], "RUN_FINISHED");
}

fn perm_sb(id: &str) -> Value {
    json!({"schemaVersion":1,"kind":"permission","requestTaskId":"task-1","contextId":ctx("t1"),"inputId":id,"toolUseId":format!("tu-{id}"),
        "scope":"candidate","subPipelineId":"c1","required":true})
}

fn get_task(meta: Value) -> Reply {
    Reply::Json(
        200,
        items::bare_task("task-1", &ctx("t1"), "TASK_STATE_INPUT_REQUIRED", meta),
    )
}

#[tokio::test]
async fn a_resume_delivers_every_answer_in_order() {
    let (s, k) = setup().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-1", "toolUseId": "tu-q", "prompt": "Region?", "required": true});
    let p = perm("perm-1", "tu1", "t1");
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_SUBMITTED",
                json!({"iacCodeSessionId": "s"}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": q.clone(), "pendingPermissions": [p.clone()]}),
            )),
        ]),
    );
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_eq!(
        res.last()["outcome"]["interrupts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    k.on(
        "GetTask",
        get_task(json!({"input": q, "pendingPermissions": [p]})),
    );
    // Answer 1 (the permission): accepted, its stream ends; answer 2 (the question) completes.
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": "ran"}}),
            )),
        ]),
    );
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}},
                         {"interruptId": "q-1", "status": "resolved", "payload": {"freeText": "Hangzhou"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
    let calls = k.calls("SendStreamingMessage");
    assert_eq!(calls.len(), 3);
    assert_eq!(
        calls[1].body["params"]["message"]["parts"][0]["data"]["decision"],
        "allow_once"
    );
    assert_eq!(
        calls[2].body["params"]["message"]["parts"],
        json!([{"text": "Hangzhou"}])
    );
    let results: Vec<&Value> = res.of("TOOL_CALL_RESULT");
    assert!(results
        .iter()
        .any(|e| e["toolCallId"] == "tu-q" && e["content"] == "Hangzhou"));
    assert!(results.iter().any(|e| e["toolCallId"] == "tu1"));
    let doc = s.thread_doc("t1");
    assert_eq!(doc["appliedResumeDigests"].as_array().unwrap().len(), 2);
    assert_eq!(doc["execution"]["pending"], json!({}));
}

#[tokio::test]
async fn a_failed_answer_commit_stops_before_the_next_answer() {
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (store, switch) =
        FaultyStore::new(FileStore::open(dir.path().join("state")).expect("store"));
    let s = Builder::new()
        .a2a(&k.url(), None)
        .store(Arc::new(store))
        .start()
        .await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-1", "prompt": "Region?", "required": true});
    let p = perm("perm-1", "tu1", "t1");
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_SUBMITTED",
                json!({"iacCodeSessionId": "s"}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": q.clone(), "pendingPermissions": [p.clone()]}),
            )),
        ]),
    );
    post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    k.on(
        "GetTask",
        get_task(json!({"input": q, "pendingPermissions": [p]})),
    );
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![r(items::status(
            "task-1",
            &c,
            "TASK_STATE_WORKING",
            json!({}),
        ))]),
    );
    // Saves of the resume: admission, preparation, first commit (fails).
    switch.fail_saves(2, 1);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}},
                         {"interruptId": "q-1", "status": "resolved", "payload": {"freeText": "x"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "STATE_PERSISTENCE_FAILED");
    assert_eq!(
        res.last()["message"],
        "The accepted interrupt response could not be committed."
    );
    assert_eq!(
        k.calls("SendStreamingMessage").len(),
        2,
        "the second answer must not be sent"
    );
    assert_eq!(
        k.wait_calls("CancelTask", 1, Duration::from_secs(5))
            .await
            .len(),
        1
    );
}

#[tokio::test]
async fn failed_resume_preparation_write_fails_closed() {
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (store, switch) =
        FaultyStore::new(FileStore::open(dir.path().join("state")).expect("store"));
    let s = Builder::new()
        .a2a(&k.url(), None)
        .store(Arc::new(store))
        .start()
        .await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    switch.fail_saves(1, 1);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "STATE_PERSISTENCE_FAILED");
    assert_eq!(
        res.last()["message"],
        "The interrupted execution state could not be committed."
    );
    assert_eq!(
        k.calls("SendStreamingMessage").len(),
        1,
        "nothing delivered"
    );
}

#[tokio::test]
async fn cancelling_a_paused_execution_clears_pending() {
    let (s, k) = setup().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    let exec = s.thread_doc("t1")["execution"]["executionId"]
        .as_str()
        .unwrap()
        .to_owned();
    let c = post(
        &s.cancel_url(&exec),
        &json!({"threadId": "t1", "rosInvocationId": "inv-1"}),
        &[],
    )
    .await;
    assert_eq!(c.json.unwrap()["status"], "cancelled");
    assert_eq!(k.calls("CancelTask")[0].body["params"]["id"], "task-1");
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "EXECUTION_LOST");
    assert_eq!(
        res.last()["message"],
        "The A2A task to resume is unavailable."
    );
}

#[tokio::test]
async fn newly_discovered_pending_interrupts_end_the_resume_with_all_of_them() {
    let (s, k) = setup().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on("GetTask", get_task(json!({"pendingPermissions": [perm("perm-1", "tu1", "t1"), perm("perm-2", "tu2", "t1")]})));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    let ids: Vec<&str> = res.last()["outcome"]["interrupts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["perm-1", "perm-2"]);
    assert_eq!(
        k.calls("SendStreamingMessage").len(),
        1,
        "no answer delivered"
    );
}

#[tokio::test]
async fn sideband_permission_answers() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"iacCodeSessionId": "s"}),
            )),
            r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"pipeline": {"eventId": "evt-3", "sequence": 3.0, "eventType": "candidate_started", "data": {}}}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pendingPermissions": [perm_sb("p1"), perm_sb("p2")]}),
            )),
        ]),
    );
    let res = post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    assert_eq!(s.thread_doc("t1")["execution"]["pipelineSequence"], 3);
    assert_eq!(
        res.last()["outcome"]["interrupts"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        s.thread_doc("t1")["execution"]["pending"]["p1"]["sideband"],
        true
    );
    let both = json!([{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}},
                      {"interruptId": "p2", "status": "cancelled"}]);
    // Backup not ready on the first send: retryable, pending kept.
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pendingPermissions": [perm_sb("p1"), perm_sb("p2")]}),
            ),
        ),
    );
    k.on("SendMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "x", "data": {"code": "SESSION_BACKUP_NOT_READY", "retryable": true}}})));
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", both.clone()),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "SESSION_BACKUP_NOT_READY");
    assert_eq!(
        res.last()["message"],
        "Session backup is still synchronizing. Retry after 3 seconds."
    );
    assert!(s.thread_doc("t1")["execution"]["pending"]["p1"].is_object());
    // Now both are accepted: two unary sends, then GetTask / SubscribeToTask follow-up.
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pendingPermissions": [perm_sb("p1"), perm_sb("p2")]}),
            ),
        ),
    );
    k.on(
        "SendMessage",
        Reply::Json(
            200,
            json!({"message": {"messageId": "ack-1", "role": "ROLE_AGENT", "parts": []}}),
        ),
    );
    k.on(
        "SendMessage",
        Reply::Json(
            200,
            json!({"message": {"messageId": "ack-2", "role": "ROLE_AGENT", "parts": []}}),
        ),
    );
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task("task-1", &c, "TASK_STATE_WORKING", json!({})),
        ),
    );
    // Preparation finds no catch-up; after the sideband answers the deferred catch-up does.
    k.on(
        "pipeline-state",
        Reply::Json(404, json!({"error": "A2A pipeline state not found"})),
    );
    k.on("pipeline-state", Reply::Json(200, json!({"snapshot": {"pipelineRunId": c, "lastSequence": 5},
        "events": [{"eventId": "evt-5", "sequence": 5, "eventType": "candidate_completed", "data": {}}]})));
    k.on(
        "SubscribeToTask",
        Reply::Sse(vec![
            r(items::task("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::text("task-1", &c, "continuing", "m", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    let res = post(
        &s.url,
        &resume_body("t1", "r3", &s.ws("w"), "inv-1", both),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r3");
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
    let sends = k.calls("SendMessage");
    assert_eq!(sends.len(), 3);
    assert_eq!(
        sends[1].body["params"]["message"]["messageId"],
        "agui-resume-p1"
    );
    assert_eq!(
        sends[2].body["params"]["message"]["messageId"],
        "agui-resume-p2"
    );
    assert_eq!(
        sends[2].body["params"]["message"]["parts"][0]["data"]["decision"],
        "deny"
    );
    assert_eq!(k.calls("SubscribeToTask").len(), 1);
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    let t = res.types();
    assert!(
        t.contains(&"ACTIVITY_SNAPSHOT".to_owned()),
        "deferred catch-up: {t:?}"
    );
    let catchups: Vec<String> = k
        .requests()
        .into_iter()
        .filter(|r| r.path == "/iac-code/pipeline/state")
        .filter_map(|r| r.query)
        .collect();
    assert_eq!(catchups.last().unwrap(), "taskId=task-1&afterSequence=3");
    assert!(res.events.iter().any(|e| e["value"]["eventId"] == "evt-5"));
}

#[tokio::test]
async fn sideband_answer_rejected_by_the_kernel() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"iacCodeSessionId": "s"}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pendingPermissions": [perm_sb("p1")]}),
            )),
        ]),
    );
    post(&s.url, &body("t1", "r1", "x", &s.ws("w"), json!({})), &[]).await;
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pendingPermissions": [perm_sb("p1")]}),
            ),
        ),
    );
    k.on("SendMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "input_response_mismatch: permission correlation does not match."}})));
    let entries =
        json!([{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    assert_eq!(
        res.last()["message"],
        "The local A2A execution service rejected the interrupt response."
    );
    assert!(s.thread_doc("t1")["execution"]["pending"]["p1"].is_object());
}

#[tokio::test]
async fn resume_task_identity_mismatch() {
    let (s, k) = setup().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task("task-9", &ctx("t1"), "TASK_STATE_INPUT_REQUIRED", json!({})),
        ),
    );
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "A2A_PROTOCOL_ERROR");
    assert_eq!(
        res.last()["message"],
        "The A2A task identity does not match the interrupted run."
    );
    assert!(
        s.thread_doc("t1")["execution"]["pending"]["perm-1"].is_object(),
        "still retryable"
    );
}

#[tokio::test]
async fn failed_session_id_write_fails_closed() {
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (store, switch) =
        FaultyStore::new(FileStore::open(dir.path().join("state")).expect("store"));
    let s = Builder::new()
        .a2a(&k.url(), None)
        .store(Arc::new(store))
        .start()
        .await;
    // Saves: admission, task id, session id (fails).
    switch.fail_saves(2, 1);
    let res = interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    assert_eq!(res.last()["code"], "STATE_PERSISTENCE_FAILED");
    assert_eq!(
        res.last()["message"],
        "The execution session mapping could not be committed."
    );
    assert!(
        res.sessions().iter().all(|v| v["sessionId"].is_null()),
        "an undurable session id was announced"
    );
    assert_eq!(
        k.wait_calls("CancelTask", 1, Duration::from_secs(5))
            .await
            .len(),
        1
    );
}

#[tokio::test]
async fn an_answer_the_kernel_does_not_accept_stays_retryable() {
    let (s, k) = setup().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post(
        &s.url,
        &resume_body("t1", "r2", &s.ws("w"), "inv-1", entries.clone()),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    assert_eq!(
        res.last()["message"],
        "The A2A permission response was not accepted."
    );
    assert!(s.thread_doc("t1")["execution"]["pending"]["perm-1"].is_object());
    assert!(k.calls("CancelTask").is_empty());
    // A stale answer (JSON-RPC error instead of a stream) is not accepted either.
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    k.on("SendStreamingMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "permission_resume_invalid: pending permission is not active."}})));
    let res = post(
        &s.url,
        &resume_body("t1", "r3", &s.ws("w"), "inv-1", entries),
        &[],
    )
    .await;
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    assert!(s.thread_doc("t1")["execution"]["pending"]["perm-1"].is_object());
}

/// Guidance: a user message injected into the running pipeline task while another run is
/// active; admission rules and errors.
#[tokio::test]
async fn guidance_runs() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    let pipeline = json!({"runMode": "pipeline"});
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"iacCodeSessionId": "s"}),
            )),
            Item::Sleep(Duration::from_millis(1500)),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    let url = s.url.clone();
    let b = body("t1", "r1", "deploy", &s.ws("w"), pipeline.clone());
    let main = tokio::spawn(async move { post(&url, &b, &[]).await });
    k.wait_calls("SendStreamingMessage", 1, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![r(items::status(
            "task-1",
            &c,
            "TASK_STATE_WORKING",
            json!({}),
        ))]),
    );
    let g = body(
        "t1",
        "g1",
        "use region cn-shanghai",
        &s.ws("w"),
        json!({"runMode": "pipeline", "activeGuidance": true}),
    );
    let res = post(&s.url, &g, &[]).await;
    assert_valid_run(&res, "t1", "g1");
    assert_eq!(
        res.types(),
        ["RUN_STARTED", "CUSTOM(iac-code.session.v1)", "RUN_FINISHED"]
    );
    let sent = &k.calls("SendStreamingMessage")[1].body["params"]["message"];
    assert_eq!(sent["taskId"], "task-1");
    assert_eq!(sent["parts"], json!([{"text": "use region cn-shanghai"}]));
    // Idempotency applies to guidance runs too.
    assert_eq!(
        post(&s.url, &g, &[]).await.error_code(),
        Some("DUPLICATE_RUN_ID")
    );
    // A guidance run with resume, or without pipeline mode, is refused.
    let mut bad = body("t1", "g2", "x", &s.ws("w"), json!({"activeGuidance": true}));
    assert_eq!(
        post(&s.url, &bad, &[]).await.error_code(),
        Some("EXECUTION_LOST")
    );
    bad["forwardedProps"]["iacCode"]["runMode"] = json!("pipeline");
    bad["resume"] = json!([]);
    assert_eq!(
        post(&s.url, &bad, &[]).await.error_code(),
        Some("EXECUTION_LOST")
    );
    // A kernel error on a guidance message is a RUN_ERROR and never cancels the task.
    k.on(
        "SendStreamingMessage",
        Reply::Json(200, json!({"error": {"code": -32602, "message": "bad"}})),
    );
    let g3 = body(
        "t1",
        "g3",
        "x",
        &s.ws("w"),
        json!({"runMode": "pipeline", "activeGuidance": true}),
    );
    let res = post(&s.url, &g3, &[]).await;
    assert_valid_run(&res, "t1", "g3");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    let main = main.await.unwrap();
    assert_valid_run(&main, "t1", "r1");
    assert_eq!(
        main.last()["outcome"]["type"],
        "success",
        "the main run is unaffected"
    );
    assert!(k.calls("CancelTask").is_empty());
}

/// Pipeline steps across runs: a step closed at an interrupt re-opens in the resume run, the
/// catch-up snapshot and missed events arrive, and a client deduping by (name, eventId) sees each
/// pipeline event once.
#[tokio::test]
async fn pipeline_steps_and_recovery_across_runs() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    let env = |seq: u64, t: &str, extra: Value| {
        let mut e = json!({"schemaVersion":"1.0","eventId":format!("evt-{seq}"),"sequence":seq as f64,"eventType":t,"scope":"step",
            "pipelineRunId":c,"iacCodeSessionId":"s","data":{}});
        for (k2, v) in extra.as_object().unwrap() {
            e[k2] = v.clone();
        }
        e
    };
    let q = json!({"kind":"ask_user_question","inputId":"ask-1","toolUseId":"call-ask","prompt":"Which?","options":[{"id":"a","label":"A"}],"allowFreeText":true,"required":true,"requestTaskId":"task-1"});
    k.on("SendStreamingMessage", Reply::Sse(vec![
        r(items::task("task-1", &c, "TASK_STATE_SUBMITTED", json!({}))),
        r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"pipeline": env(1, "pipeline_started", json!({"scope":"pipeline"}))}))),
        r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({"pipelineBatch": {"events": [
            env(2, "step_started", json!({"step": {"id": "intent"}})),
            env(3, "candidate_step_started", json!({"candidate": {"id": "c1"}, "candidateStep": {"id": "gen"}})),
            env(4, "candidate_step_started", json!({"candidate": {"id": "c2"}, "candidateStep": {"id": "gen"}})),
            env(5, "candidate_step_failed", json!({"candidate": {"id": "c2"}, "candidateStep": {"id": "gen"}})),
            env(4, "stack_progress", json!({})),
        ]}}))),
        r(items::status("task-1", &c, "TASK_STATE_INPUT_REQUIRED", json!({"pipeline": env(6, "input_required", json!({"step": {"id": "intent"}})), "input": q.clone()}))),
    ]));
    let r1 = post(
        &s.url,
        &body("t1", "r1", "go", &s.ws("w"), json!({"runMode": "pipeline"})),
        &[],
    )
    .await;
    assert_valid_run(&r1, "t1", "r1");
    assert_eq!(
        r1.types(),
        [
            "RUN_STARTED",
            "CUSTOM(iac-code.session.v1)",
            "CUSTOM(iac-code.session.v1)",
            "CUSTOM(iac-code.session.v1)",
            "CUSTOM(iac-code.pipeline.v1)",
            "STEP_STARTED(intent)",
            "STEP_STARTED(candidate:c1:gen)",
            "STEP_STARTED(candidate:c2:gen)",
            "STEP_FINISHED(candidate:c2:gen)",
            "CUSTOM(iac-code.pipeline.v1)",
            "STEP_FINISHED(candidate:c1:gen)",
            "STEP_FINISHED(intent)",
            "RUN_FINISHED",
        ]
    );
    let doc = s.thread_doc("t1");
    assert_eq!(
        doc["execution"]["pipelineOpenSteps"],
        json!(["candidate:c1:gen", "step:intent"])
    );
    assert_eq!(doc["execution"]["pipelineSequence"], 6);
    // Resume: re-opened steps, the catch-up snapshot (replaying evt-1 and a missed evt-7).
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task(
                "task-1",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": q}),
            ),
        ),
    );
    k.on("pipeline-state", Reply::Json(200, json!({"snapshot": {"pipelineRunId": c, "lastSequence": 7, "status": "waiting_input"},
        "events": [env(1, "pipeline_started", json!({"scope":"pipeline"})), env(7, "stack_progress", json!({}))]})));
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pipeline": env(8, "input_received", json!({"step": {"id": "intent"}}))}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pipeline": env(9, "step_completed", json!({"step": {"id": "intent"}}))}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({"pipeline": env(10, "pipeline_completed", json!({"scope":"pipeline"}))}),
            )),
        ]),
    );
    let res = post(
        &s.url,
        &resume_body(
            "t1",
            "r2",
            &s.ws("w"),
            "inv-1",
            json!([{"interruptId":"ask-1","status":"resolved","payload":{"selectedId":"a"}}]),
        ),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r2");
    let t = res.types();
    assert_eq!(
        t[1..3],
        [
            "STEP_STARTED(candidate:c1:gen)".to_owned(),
            "STEP_STARTED(intent)".to_owned()
        ]
    );
    assert!(t.contains(&"ACTIVITY_SNAPSHOT".to_owned()));
    let q = &k
        .requests()
        .into_iter()
        .find(|r| r.path == "/iac-code/pipeline/state")
        .unwrap();
    assert_eq!(q.query.as_deref(), Some("taskId=task-1&afterSequence=6"));
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
    // Dedupe across runs by (name, eventId): every pipeline event once.
    let mut seen = std::collections::BTreeSet::new();
    for e in r1.events.iter().chain(res.events.iter()) {
        if e["name"] == "iac-code.pipeline.v1" {
            seen.insert(e["value"]["eventId"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        ["evt-1", "evt-10", "evt-5", "evt-7"]
    );
}

/// Every allow-listed `iac-code.pipeline.v1` type reaches the client unchanged; a non-listed
/// one does not; a failed step closes its span and is reported.
#[tokio::test]
async fn pipeline_custom_allow_list_through_the_gateway() {
    let (s, k) = setup().await;
    let c = ctx("t1");
    let mut events: Vec<Value> = iac_code_agui::mapping::ALLOW_LIST
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"schemaVersion": "1.0", "eventId": format!("e{i}"), "sequence": (i + 1) as f64, "eventType": t, "data": {"n": i}}))
        .collect();
    let n = events.len() as f64;
    events.push(
        json!({"eventId": "x1", "sequence": n + 1.0, "eventType": "backup_committed", "data": {}}),
    );
    events.push(json!({"eventId": "x2", "sequence": n + 2.0, "eventType": "step_started", "step": {"id": "s9"}, "data": {}}));
    events.push(json!({"eventId": "x3", "sequence": n + 3.0, "eventType": "step_failed", "step": {"id": "s9"}, "data": {"error": "boom"}}));
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_WORKING",
                json!({"pipelineBatch": {"events": events}}),
            )),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    let res = post(
        &s.url,
        &body("t1", "r1", "x", &s.ws("w"), json!({"runMode": "pipeline"})),
        &[],
    )
    .await;
    assert_valid_run(&res, "t1", "r1");
    let customs: Vec<&Value> = res
        .events
        .iter()
        .filter(|e| e["name"] == "iac-code.pipeline.v1")
        .map(|e| &e["value"])
        .collect();
    let types: Vec<&str> = customs
        .iter()
        .map(|v| v["eventType"].as_str().unwrap())
        .collect();
    let mut expected: Vec<&str> = iac_code_agui::mapping::ALLOW_LIST.to_vec();
    expected.push("step_failed");
    assert_eq!(types, expected);
    assert_eq!(customs[0]["data"]["n"], 0, "envelopes pass unchanged");
    assert_eq!(customs[0]["schemaVersion"], "1.0");
    let t = res.types();
    let started = t.iter().position(|x| x == "STEP_STARTED(s9)").unwrap();
    assert_eq!(t[started + 1], "STEP_FINISHED(s9)");
}
