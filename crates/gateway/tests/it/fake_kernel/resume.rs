//! Interrupts and resumes against the fake kernel: permissions and questions, every answer
//! delivered in order and committed before the next, sideband answers, refusals that keep the
//! interrupt answerable, expiry, and writes that fail closed.

use super::*;

#[tokio::test]
async fn permission_interrupt_and_resume() {
    let (s, k) = fake_gateway().await;
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
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
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
            get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
        );
        let run = format!("r-{code}-{}", entries.as_array().unwrap().len());
        let res = post_resume(&s.url, "t1", &run, &s.ws("w"), "inv-1", entries).await;
        assert_valid_run(&res, "t1", &run);
        assert_eq!(res.last()["code"], code);
    }
    // Valid resume.
    let c = ctx("t1");
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    k.stream(
        Stream::of("task-1", &c)
            .working(json!({"inputReceived": {"kind": "permission", "inputId": "perm-1"}}))
            .working(json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": "ok"}}))
            .text("Let me run. Done", "m-a")
            .input_required(json!({})),
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
    let (s, k) = fake_gateway().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-1", "toolUseId": "tu-q", "prompt": "Which region?", "requestTaskId": "task-1",
        "options": [{"id": "a", "label": "Hangzhou"}, {"id": "b", "label": "Beijing"}], "allowFreeText": true, "required": true});
    let res = interrupted(&s, &k, q.clone()).await;
    let i = &res.last()["outcome"]["interrupts"][0];
    assert_eq!(i["reason"], "input_required");
    assert_eq!(i["message"], "Which region?\n- a: Hangzhou\n- b: Beijing");
    assert_eq!(i["responseSchema"]["oneOf"].as_array().unwrap().len(), 3);
    let c = ctx("t1");
    k.on("GetTask", get_task(json!({"input": q})));
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", json!([{"interruptId": "q-1", "status": "resolved", "payload": {"selectedId": "a", "freeText": "x"}}])).await;
    assert_eq!(res.last()["code"], "RESUME_PAYLOAD_INVALID");
    k.on("GetTask", get_task(json!({"input": q})));
    k.stream(Stream::of("task-1", &c).working(json!({})).completed());
    let entries =
        json!([{"interruptId": "q-1", "status": "resolved", "payload": {"selectedId": "a"}}]);
    let res = post_resume(&s.url, "t1", "r3", &s.ws("w"), "inv-1", entries).await;
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
    let (s, k) = fake_gateway().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-2", "prompt": "Anything?", "required": true});
    interrupted(&s, &k, q.clone()).await;
    k.on("GetTask", get_task(json!({"input": q})));
    let entries = json!([{"interruptId": "q-2", "status": "cancelled"}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "CANCELLED");
    assert_eq!(
        res.last()["message"],
        "The execution was cancelled by the interrupt response."
    );
    assert_eq!(k.calls("CancelTask")[0].body["params"]["id"], "task-1");
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let res = post_turn(&s.url, "t1", "r3", "next", &s.ws("w")).await;
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn session_restore_failures_keep_pending() {
    let (s, k) = fake_gateway().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    k.on(
        "ensure-restored",
        Reply::Json(404, json!({"status": "not_found"})),
    );
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries.clone()).await;
    assert_eq!(res.last()["code"], "EXECUTION_LOST");
    assert_eq!(
        res.last()["message"],
        "The iac-code session to resume is unavailable."
    );
    k.on("ensure-restored", Reply::Json(409, json!({"error": {"code": "SESSION_BACKUP_NOT_READY", "message": "Session backup is still synchronizing. Retry after 3 seconds.", "retryable": true}})));
    let res = post_resume(&s.url, "t1", "r3", &s.ws("w"), "inv-1", entries).await;
    assert_eq!(res.last()["code"], "SESSION_BACKUP_NOT_READY");
    assert!(s.thread_doc("t1")["execution"]["pending"]["perm-1"].is_object());
    assert!(k.calls("CancelTask").is_empty());
}

#[tokio::test]
async fn interrupt_expiry() {
    let k = FakeKernel::start().await;
    let clock = Arc::new(OffsetClock::default());
    let s = Builder::for_fake(&k)
        .clock(clock.clone())
        .config(move |c| c.interrupt_ttl_secs = 60)
        .start()
        .await;
    let res = interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    assert!(res.last()["outcome"]["interrupts"][0]["expiresAt"].is_string());
    clock.offset_ms.store(61_000, Ordering::SeqCst);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries.clone()).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "EXECUTION_EXPIRED");
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    assert_cancelled_once(&k).await;
    // Remembered: answering again is still EXECUTION_EXPIRED; a new turn works.
    let res = post_resume(&s.url, "t1", "r3", &s.ws("w"), "inv-1", entries).await;
    assert_eq!(res.last()["code"], "EXECUTION_EXPIRED");
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let res = post_turn(&s.url, "t1", "r4", "x", &s.ws("w")).await;
    assert_eq!(res.status, 200);
}

#[tokio::test]
async fn a_resume_delivers_every_answer_in_order() {
    let (s, k) = fake_gateway().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-1", "toolUseId": "tu-q", "prompt": "Region?", "required": true});
    let p = perm("perm-1", "tu1", "t1");
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "s"}))
            .input_required(json!({"input": q.clone(), "pendingPermissions": [p.clone()]})),
    );
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
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
    k.stream(
        Stream::of("task-1", &c)
            .working(json!({}))
            .working(json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": "ran"}})),
    );
    k.stream(Stream::of("task-1", &c).working(json!({})).completed());
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}},
                         {"interruptId": "q-1", "status": "resolved", "payload": {"freeText": "Hangzhou"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
    let s = Builder::for_fake(&k).store(Arc::new(store)).start().await;
    let q = json!({"kind": "ask_user_question", "inputId": "q-1", "prompt": "Region?", "required": true});
    let p = perm("perm-1", "tu1", "t1");
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "s"}))
            .input_required(json!({"input": q.clone(), "pendingPermissions": [p.clone()]})),
    );
    post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    k.on(
        "GetTask",
        get_task(json!({"input": q, "pendingPermissions": [p]})),
    );
    k.stream(Stream::of("task-1", &c).working(json!({})));
    // Saves of the resume: admission, preparation, the first answer's mark (on its way), its
    // commit (fails), and the save that ends the execution (fails too).
    switch.fail_saves(3, 2);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}},
                         {"interruptId": "q-1", "status": "resolved", "payload": {"freeText": "x"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
    assert_cancelled_once(&k).await;
    // The task is cancelled: its interrupts are not offered any more, even though the save
    // that ended the execution failed. A new turn is admitted, not refused as waiting.
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let res = post_turn(&s.url, "t1", "r3", "y", &s.ws("w")).await;
    assert_eq!(res.status, 200, "{}", res.raw);
}

#[tokio::test]
async fn failed_resume_preparation_write_fails_closed() {
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (store, switch) =
        FaultyStore::new(FileStore::open(dir.path().join("state")).expect("store"));
    let s = Builder::for_fake(&k).store(Arc::new(store)).start().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    switch.fail_saves(1, 1);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
    let (s, k) = fake_gateway().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    let exec = s.execution_id("t1");
    let c = s.cancel(&exec, "t1", "inv-1").await;
    assert_eq!(c.json.unwrap()["status"], "cancelled");
    assert_eq!(k.calls("CancelTask")[0].body["params"]["id"], "task-1");
    assert_eq!(s.thread_doc("t1")["execution"]["pending"], json!({}));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "EXECUTION_LOST");
    assert_eq!(
        res.last()["message"],
        "The A2A task to resume is unavailable."
    );
}

#[tokio::test]
async fn newly_discovered_pending_interrupts_end_the_resume_with_all_of_them() {
    let (s, k) = fake_gateway().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on("GetTask", get_task(json!({"pendingPermissions": [perm("perm-1", "tu1", "t1"), perm("perm-2", "tu2", "t1")]})));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
            .working(json!({"pipeline": {"eventId": "evt-3", "sequence": 3.0, "eventType": "candidate_started", "data": {}}}))
            .working(json!({"pendingPermissions": [perm_sb("p1"), perm_sb("p2")]})),
    );
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
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
    k.task_is_working(
        "task-1",
        &c,
        json!({"pendingPermissions": [perm_sb("p1"), perm_sb("p2")]}),
    );
    k.on("SendMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "x", "data": {"code": "SESSION_BACKUP_NOT_READY", "retryable": true}}})));
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", both.clone()).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "SESSION_BACKUP_NOT_READY");
    assert_eq!(
        res.last()["message"],
        "Session backup is still synchronizing. Retry after 3 seconds."
    );
    assert!(s.thread_doc("t1")["execution"]["pending"]["p1"].is_object());
    // Now both are accepted: two unary sends, then GetTask / SubscribeToTask follow-up.
    k.task_is_working(
        "task-1",
        &c,
        json!({"pendingPermissions": [perm_sb("p1"), perm_sb("p2")]}),
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
    k.task_is_working("task-1", &c, json!({}));
    // Preparation finds no catch-up; after the sideband answers the deferred catch-up does.
    k.on(
        "pipeline-state",
        Reply::Json(404, json!({"error": "A2A pipeline state not found"})),
    );
    k.on("pipeline-state", Reply::Json(200, json!({"snapshot": {"pipelineRunId": c, "lastSequence": 5},
        "events": [{"eventId": "evt-5", "sequence": 5, "eventType": "candidate_completed", "data": {}}]})));
    k.on(
        "SubscribeToTask",
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({}))
            .text("continuing", "m")
            .completed(),
    );
    let res = post_resume(&s.url, "t1", "r3", &s.ws("w"), "inv-1", both).await;
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
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
            .working(json!({"pendingPermissions": [perm_sb("p1")]})),
    );
    post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    k.task_is_working("task-1", &c, json!({"pendingPermissions": [perm_sb("p1")]}));
    k.on("SendMessage", Reply::Json(200, json!({"error": {"code": -32602, "message": "input_response_mismatch: permission correlation does not match."}})));
    let entries =
        json!([{"interruptId": "p1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
    let (s, k) = fake_gateway().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.task_awaits_input("task-9", &ctx("t1"), json!({}));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
async fn an_answer_the_kernel_does_not_accept_stays_retryable() {
    let (s, k) = fake_gateway().await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    k.on("SendStreamingMessage", Reply::Sse(vec![]));
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries.clone()).await;
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
    let res = post_resume(&s.url, "t1", "r3", &s.ws("w"), "inv-1", entries).await;
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE");
    assert!(s.thread_doc("t1")["execution"]["pending"]["perm-1"].is_object());
}

/// `agui_pending_interrupts` and `agui_interrupts_total`: an interrupt counts when it is created,
/// still counts after a restart before its thread is loaded (the store's start-up count), and
/// stops counting when it expires (then once as expired); the process never counts it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_interrupt_gauge_holds_across_a_restart_and_an_expiry() {
    use crate::support::metric;
    let k = FakeKernel::start().await;
    let clock = Arc::new(OffsetClock::default());
    let s = Builder::for_fake(&k)
        .clock(clock.clone())
        .config(move |c| c.interrupt_ttl_secs = 60)
        .start()
        .await;
    interrupted(&s, &k, perm("perm-1", "tu1", "t1")).await;
    assert_eq!(metric(&s, "agui_pending_interrupts"), 1.0);
    assert_eq!(metric(&s, "agui_interrupts_total{event=\"created\"}"), 1.0);
    // A refused admission (the same run id again) saves nothing, and counts no save.
    let saves = metric(&s, "agui_state_save_duration_seconds_count");
    assert!(saves >= 2.0);
    let again = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    assert_eq!(again.status, 409);
    assert_eq!(metric(&s, "agui_state_save_duration_seconds_count"), saves);
    assert_eq!(metric(&s, "agui_admission_duration_seconds_count"), 2.0);
    let ws = s.ws("w");
    let dir = s.stop().await;
    let s = Builder::new()
        .dir(dir)
        .a2a(&k.url(), None)
        .clock(clock.clone())
        .config(move |c| c.interrupt_ttl_secs = 60)
        .start()
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&s, "agui_pending_interrupts") != 1.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        metric(&s, "agui_pending_interrupts"),
        1.0,
        "counted from the store"
    );
    clock.offset_ms.store(61_000, Ordering::SeqCst);
    let entries = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let res = post_resume(&s.url, "t1", "r2", &ws, "inv-1", entries).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["code"], "EXECUTION_EXPIRED");
    assert_eq!(
        metric(&s, "agui_pending_interrupts"),
        0.0,
        "loaded, then expired"
    );
    assert_eq!(metric(&s, "agui_interrupts_total{event=\"expired\"}"), 1.0);
    assert_eq!(metric(&s, "agui_interrupts_total{event=\"created\"}"), 0.0);
    assert_eq!(
        metric(
            &s,
            "agui_runs_finished_total{outcome=\"error\",code=\"EXECUTION_EXPIRED\"}"
        ),
        1.0
    );
}
