//! Guidance runs against the fake kernel.

use super::*;

/// Guidance: a user message injected into the running pipeline task while another run is
/// active; admission rules and errors.
#[tokio::test]
async fn guidance_runs() {
    let (s, k) = fake_gateway().await;
    let c = ctx("t1");
    let pipeline = json!({"runMode": "pipeline"});
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
            .then(Item::Sleep(Duration::from_millis(1500)))
            .completed(),
    );
    let main = spawn_post(
        &s.url,
        body("t1", "r1", "deploy", &s.ws("w"), pipeline.clone()),
    );
    k.wait_calls("SendStreamingMessage", 1, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    k.stream(Stream::of("task-1", &c).working(json!({})));
    let g = guidance_body("t1", "g1", "use region cn-shanghai", &s.ws("w"));
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
    let g3 = guidance_body("t1", "g3", "x", &s.ws("w"));
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

/// A later iac-code's fields: `executionFence`, `guidanceId` and `inputDigest` reach the kernel
/// in `metadata.iac_code` (as `execution_fence`, `guidance_id`, `input_digest`) with every
/// message of the request that carries them (a turn, a guidance, the answer of a resume), each
/// as that request gives them; a bad one is refused by name; none is kept in the state.
#[tokio::test]
async fn a_later_iac_codes_fence_and_guidance_identity_reach_the_kernel_and_are_not_kept() {
    let (s, k) = fake_gateway().await;
    let fence = json!({"version": "session-handoff-v1", "owner": {"sandboxId": "sb-fence-1",
        "activationId": "a-1", "runId": "r-1", "leaseId": "l-1", "identityKind": "slot"}});
    let meta = |k: &FakeKernel, n: usize| {
        k.calls("SendStreamingMessage")[n].body["params"]["message"]["metadata"]["iac_code"].clone()
    };
    // A turn that stops at a permission, with the fence.
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "s"}))
            .input_required(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    let turn = body(
        "t1",
        "r1",
        "x",
        &s.ws("w"),
        json!({"executionFence": fence}),
    );
    let res = post(&s.url, &turn, &[]).await;
    assert_valid_run(&res, "t1", "r1");
    let m = meta(&k, 0);
    assert_eq!(m["execution_fence"], fence);
    assert!(
        m.get("guidance_id").is_none() && m.get("input_digest").is_none(),
        "{m}"
    );

    // Its answer, with all three (snake_case as well as camelCase is taken).
    k.on(
        "GetTask",
        get_task(json!({"input": perm("perm-1", "tu1", "t1")})),
    );
    k.stream(Stream::of("task-1", &c).completed());
    let mut resume = resume_body(
        "t1",
        "r2",
        &s.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]),
    );
    let iac = &mut resume["forwardedProps"]["iacCode"];
    iac["execution_fence"] = fence.clone();
    iac["guidance_id"] = json!("guidance-id-1");
    iac["inputDigest"] = json!("input-digest-1");
    let res = post(&s.url, &resume, &[]).await;
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
    let m = meta(&k, 1);
    assert_eq!(m["execution_fence"], fence);
    assert_eq!(m["guidance_id"], "guidance-id-1");
    assert_eq!(m["input_digest"], "input-digest-1");

    // Refused by name, before the stream.
    for (field, value, message) in [
        (
            "guidanceId",
            json!(""),
            "iacCode.guidanceId must be a string",
        ),
        (
            "inputDigest",
            json!(7),
            "iacCode.inputDigest must be a string",
        ),
        (
            "executionFence",
            json!("owner"),
            "iacCode.executionFence must be a JSON object",
        ),
    ] {
        let bad = body("t1", "r3", "x", &s.ws("w"), json!({ field: value }));
        let r = post(&s.url, &bad, &[]).await;
        assert_eq!(r.status, 400);
        assert_eq!(r.error_code(), Some("INVALID_INPUT"));
        assert!(
            r.error_message().unwrap().starts_with(message),
            "{:?}",
            r.json
        );
    }

    // Nothing of them in the state: the document, the transcript, the journal.
    let state = s.state_dir();
    let mut files = vec![state.clone()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        } else if let Ok(bytes) = std::fs::read(&p) {
            let text = String::from_utf8_lossy(&bytes);
            for kept in ["sb-fence-1", "guidance-id-1", "input-digest-1"] {
                assert!(!text.contains(kept), "{kept} in {}", p.display());
            }
        }
    }
}
