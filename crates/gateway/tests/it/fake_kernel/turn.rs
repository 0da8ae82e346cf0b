//! New turns against the fake kernel: the request the kernel gets, the mapping of a whole turn,
//! every ending (states, errors, identity changes, faults), heartbeats, disconnects, the
//! cancellation extension, backpressure, and writes that fail closed.

use super::*;

#[tokio::test]
async fn full_turn_mapping_and_request_shape() {
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .working(json!({"thinking": {"type": "raw_thinking", "text": "hmm"}}))
            .text("Hello ", "msg-a")
            .then(Item::Raw(": ping - 2026-11-29 19:00:00\r\n\r\n".into()))
            .text("world", "msg-a")
            .working(json!({"tool": {"status": "input_complete", "toolUseId": "tu1", "name": "read", "toolInput": {"path": "a", "b": 1}}}))
            .working(json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": {"ok": true}}}))
            .working(json!({"usage": {"provider": "p", "model": "m", "inputTokens": 10.0, "outputTokens": 5.0, "totalTokens": 15.0}}))
            .artifact(json!({"artifactId": "a1", "name": "f.txt"}))
            .then(Item::Result(json!({"statusUpdate": {"taskId": "task-1", "contextId": c, "status": {"state": "TASK_STATE_WORKING",
            "message": {"role": "ROLE_AGENT", "parts": [{"text": "Hello world"}], "messageId": "task-1-2"}},
            "metadata": {"iac_code": {"assistantFinal": {"complete": true}}}}})))
            .input_required(json!({})),
    );
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
    let (s, k) = fake_gateway().await;
    let french = [("accept-language", "fr")];
    let res = post_turn_as(&s.url, "t1", "r1", "x", &s.ws("w"), &french).await;
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
        assert_cancelled_once(&k).await;
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
    let (s, k) = fake_gateway().await;
    k.on(
        "SendStreamingMessage",
        Reply::Json(
            200,
            json!({"error": {"code": -32602, "message": "Unsupported run mode."}}),
        ),
    );
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    k.on("SendStreamingMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "Session backup is still synchronizing. Retry after 3 seconds.",
        "data": {"code": "SESSION_BACKUP_NOT_READY", "retryable": true}}})));
    let res = post_turn(&s.url, "t1", "r2", "x", &s.ws("w")).await;
    assert_eq!(res.last()["code"], "SESSION_BACKUP_NOT_READY");
    // Kernel down.
    let s = Builder::new().kernel_unreachable().start().await;
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
}

#[tokio::test]
async fn heartbeat_after_silence() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .heartbeat(Duration::from_millis(300))
        .start()
        .await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({}))
            .then(Item::Sleep(Duration::from_millis(1000)))
            .input_required(json!({})),
    );
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    assert_valid_run(&res, "t1", "r1");
    assert!(res.heartbeats >= 2, "{}", res.raw);
    assert!(res.raw.contains("\n\n: heartbeat\n\n"));
}

#[tokio::test]
async fn client_disconnect_cancels_the_task() {
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({}))
            .then(Item::Stall),
    );
    let client = client();
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
    let res = post_turn(&s.url, "t1", "r2", "x", &s.ws("w")).await;
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn cancel_extension_during_a_run() {
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
            .text("tick", "m")
            .then(Item::Sleep(Duration::from_millis(800)))
            .status("TASK_STATE_CANCELED", json!({})),
    );
    let run = spawn_post(&s.url, body("t1", "r1", "x", &s.ws("w"), json!({})));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exec = s.execution_id("t1");
    let r1 = s.cancel(&exec, "t1", "nope").await;
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
    let r2 = s.cancel(&exec, "t1", "whatever").await;
    assert_eq!(r2.json.unwrap()["status"], "already_terminal");
    let r3 = s.cancel("zzz", "t1", "inv-1").await;
    assert_eq!(r3.status, 404);
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
        let s = Builder::for_fake(&k).store(Arc::new(store)).start().await;
        switch.fail_saves(skip, 1);
        let res = interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
        assert_eq!(res.last()["code"], "STATE_PERSISTENCE_FAILED");
        assert_eq!(res.last()["message"], message);
        // The client never saw an interrupt that was not durable.
        assert!(res.of("RUN_FINISHED").is_empty());
        assert_cancelled_once(&k).await;
    }
}

#[tokio::test]
async fn failed_session_id_write_fails_closed() {
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (store, switch) =
        FaultyStore::new(FileStore::open(dir.path().join("state")).expect("store"));
    let s = Builder::for_fake(&k).store(Arc::new(store)).start().await;
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
    assert_cancelled_once(&k).await;
}

/// A slow client slows its kernel stream: the gateway buffers a bounded number of events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_backpressure_bounds_memory() {
    let (s, k) = fake_gateway().await;
    let n = 100_000;
    let end = r(items::status(
        "task-1",
        &ctx("t1"),
        "TASK_STATE_INPUT_REQUIRED",
        json!({}),
    ));
    k.on("SendStreamingMessage", flood("t1", n, end));
    let client = client();
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
