//! Guidance runs against the fake kernel.

use super::*;

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
