//! Pipeline runs against the fake kernel: steps and recovery across runs, the CUSTOM allow-list.

use super::*;

/// Pipeline steps across runs: a step closed at an interrupt re-opens in the resume run, the
/// catch-up snapshot and missed events arrive, and a client deduping by (name, eventId) sees each
/// pipeline event once.
#[tokio::test]
async fn pipeline_steps_and_recovery_across_runs() {
    let (s, k) = fake_gateway().await;
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
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({}))
            .working(json!({"pipeline": env(1, "pipeline_started", json!({"scope":"pipeline"}))}))
            .working(json!({"pipelineBatch": {"events": [
            env(2, "step_started", json!({"step": {"id": "intent"}})),
            env(3, "candidate_step_started", json!({"candidate": {"id": "c1"}, "candidateStep": {"id": "gen"}})),
            env(4, "candidate_step_started", json!({"candidate": {"id": "c2"}, "candidateStep": {"id": "gen"}})),
            env(5, "candidate_step_failed", json!({"candidate": {"id": "c2"}, "candidateStep": {"id": "gen"}})),
            env(4, "stack_progress", json!({})),
        ]}}))
            .input_required(json!({"pipeline": env(6, "input_required", json!({"step": {"id": "intent"}})), "input": q.clone()})),
    );
    let r1 = pipeline_run(&s, "go").await;
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
    k.on("GetTask", get_task(json!({"input": q})));
    k.on("pipeline-state", Reply::Json(200, json!({"snapshot": {"pipelineRunId": c, "lastSequence": 7, "status": "waiting_input"},
        "events": [env(1, "pipeline_started", json!({"scope":"pipeline"})), env(7, "stack_progress", json!({}))]})));
    k.stream(
        Stream::of("task-1", &c)
            .working(
                json!({"pipeline": env(8, "input_received", json!({"step": {"id": "intent"}}))}),
            )
            .working(
                json!({"pipeline": env(9, "step_completed", json!({"step": {"id": "intent"}}))}),
            )
            .status(
                "TASK_STATE_COMPLETED",
                json!({"pipeline": env(10, "pipeline_completed", json!({"scope":"pipeline"}))}),
            ),
    );
    let entries = json!([{"interruptId":"ask-1","status":"resolved","payload":{"selectedId":"a"}}]);
    let res = post_resume(&s.url, "t1", "r2", &s.ws("w"), "inv-1", entries).await;
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
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    let mut events: Vec<Value> = engine::mapping::ALLOW_LIST
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
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({}))
            .working(json!({"pipelineBatch": {"events": events}}))
            .completed(),
    );
    let res = pipeline_run(&s, "x").await;
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
    let mut expected: Vec<&str> = engine::mapping::ALLOW_LIST.to_vec();
    expected.push("step_failed");
    assert_eq!(types, expected);
    assert_eq!(customs[0]["data"]["n"], 0, "envelopes pass unchanged");
    assert_eq!(customs[0]["schemaVersion"], "1.0");
    let t = res.types();
    let started = t.iter().position(|x| x == "STEP_STARTED(s9)").unwrap();
    assert_eq!(t[started + 1], "STEP_FINISHED(s9)");
}

/// Starts the pipeline run `r1` of thread `t1` with `msg`: the whole answer.
async fn pipeline_run(s: &TestServer, msg: &str) -> RunResult {
    let b = body("t1", "r1", msg, &s.ws("w"), json!({"runMode": "pipeline"}));
    post(&s.url, &b, &[]).await
}
