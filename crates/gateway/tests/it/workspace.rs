//! Workspaces and images: the default workspace root is a private directory of the state dir; a
//! workspace is created and an image decoded only for a request its thread would admit.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Item, Stream};
use testkit::sse::{self, post};

use crate::support::{
    body, client, ctx, free_port, gateway_command, http_get, metric, png_base64, post_turn,
    resume_body, spawn_healthy, spawn_post, Builder,
};

const DECODED: &str = "agui_images_decoded_total";

/// A PNG that is costly to decode and scale down (wider than 2,000 px), yet small and valid.
fn wide_png() -> String {
    png_base64(2400, 600)
}

/// `b` with its user message made of a text and an image whose base64 is `data`.
fn with_image(mut b: Value, data: &str) -> Value {
    b["messages"][0]["content"] = json!([{"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "data", "value": data, "mimeType": "image/png"}}]);
    b
}

/// Requests refused by their thread (busy, a used run id, guidance or a resume with nothing to
/// join) decode no image and create no workspace; one whose image does not decode is a 400 before
/// the stream that saves nothing and creates nothing; an admitted one gets both.
#[tokio::test]
async fn a_request_refused_by_its_thread_decodes_no_image_and_creates_no_workspace() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    let png = wide_png();
    // t1 held by a run that streams on.
    k.stream(
        Stream::of("task-1", &ctx("t1"))
            .task("TASK_STATE_WORKING", json!({}))
            .then(Item::Stall),
    );
    let running = spawn_post(&s.url, body("t1", "r1", "go", &s.ws("held"), json!({})));
    k.wait_calls("SendStreamingMessage", 1, Duration::from_secs(5))
        .await;

    let fresh = |name: &str| s.ws(name);
    let refused = [
        // Busy (and bound to another workspace: busy is decided first).
        (
            with_image(body("t1", "r2", "x", &fresh("a"), json!({})), &png),
            "THREAD_BUSY",
        ),
        // A run id used before, with another request.
        (
            with_image(body("t1", "r1", "x", &fresh("b"), json!({})), &png),
            "RUN_ID_CONFLICT",
        ),
        // Guidance on a thread that has never run.
        (
            with_image(
                body(
                    "t9",
                    "r1",
                    "x",
                    &fresh("c"),
                    json!({"activeGuidance": true}),
                ),
                &png,
            ),
            "EXECUTION_LOST",
        ),
        // A resume with nothing to resume (no message: only its workspace is at stake).
        (
            resume_body("t8", "r1", &fresh("d"), "inv-1", json!([])),
            "EXECUTION_LOST",
        ),
    ];
    // Refused for a field, before its thread is even looked at.
    let mut tools = with_image(body("t3", "r1", "x", &fresh("f"), json!({})), &png);
    tools["tools"] = json!([{"name": "t", "description": "d", "parameters": {}}]);
    let outside = with_image(body("t3", "r1", "x", "/etc/agui-w", json!({})), &png);
    for b in [tools, outside] {
        assert_eq!(post(&s.url, &b, &[]).await.status, 400);
    }
    for (b, code) in &refused {
        let r = post(&s.url, b, &[]).await;
        assert_eq!(r.error_code(), Some(*code), "{}", r.raw);
    }
    assert_eq!(
        metric(&s, DECODED),
        0.0,
        "a refused request decoded its image"
    );
    for name in ["a", "b", "c", "d", "f"] {
        assert!(
            !Path::new(&fresh(name)).exists(),
            "a refused request created its workspace {name}"
        );
    }

    // An image that does not decode: a 400 before the stream, after its decode; nothing saved
    // (the run id is still free), nothing created.
    let bad = with_image(body("t2", "r1", "x", &fresh("e"), json!({})), "aGVsbG8=");
    let r = post(&s.url, &bad, &[]).await;
    assert_eq!(
        (r.status, r.error_code(), r.error_message()),
        (
            400,
            Some("INVALID_INPUT"),
            Some("The image data is invalid.")
        )
    );
    assert_eq!(metric(&s, DECODED), 1.0);
    assert!(!Path::new(&fresh("e")).exists());
    assert_eq!(k.calls("SendStreamingMessage").len(), 1);

    // A workspace that cannot be created (a file is in its way): its own 400 before the stream,
    // and the thread never came to be.
    std::fs::write(fresh("file"), b"x").unwrap();
    let r = post_turn(&s.url, "t4", "r1", "x", &fresh("file/sub")).await;
    assert_eq!(
        (r.status, r.error_message()),
        (400, Some("The iac-code workspace cannot be created."))
    );
    let thread = http_get(format!("{}threads/t4", s.url)).await;
    assert_eq!(thread.status(), 404);

    // Admitted: decoded (scaled down to 2,000 px), the workspace created, the kernel gets both.
    k.stream(Stream::of("task-2", &ctx("t2")).task("TASK_STATE_COMPLETED", json!({})));
    let good = with_image(body("t2", "r1", "x", &fresh("e"), json!({})), &png);
    let r = post(&s.url, &good, &[]).await;
    sse::assert_valid_run(&r, "t2", "r1");
    assert_eq!(metric(&s, DECODED), 2.0);
    assert!(Path::new(&fresh("e")).is_dir());
    let sent = &k.calls("SendStreamingMessage")[1].body;
    let parts = &sent["params"]["message"]["parts"];
    assert_eq!(parts[1]["data"]["filename"], "agui-image-2", "{parts}");
    running.abort();
}

/// Without configured roots, workspaces go under `<state-dir>/workspaces`, created 0700 at
/// start-up: the process's directory and the temporary directory are no longer roots.
#[tokio::test]
async fn without_configured_roots_workspaces_live_in_the_state_dir() {
    use std::os::unix::fs::PermissionsExt;
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().canonicalize().unwrap();
    let here = dir.join("process-dir");
    std::fs::create_dir_all(&here).unwrap();
    let port = free_port();
    let mut child = spawn_healthy(
        gateway_command(port, &dir.join("state"))
            .args(["--a2a-url", &k.url()])
            .current_dir(&here)
            .env_remove("IAC_CODE_AGUI_ALLOWED_CWDS")
            .env_remove("IACCODE_A2A_ALLOWED_CWDS")
            .env_remove("IAC_CODE_AGUI_AUTH_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        port,
        Duration::from_secs(10),
    );
    let root = dir.join("state/workspaces");
    let mode = std::fs::metadata(&root).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    let url = format!("http://127.0.0.1:{port}/");
    let tmp = std::env::temp_dir().join(format!("agui-ws-{port}"));
    for outside in [here.join("w"), tmp.clone()] {
        let b = body("t1", "r1", "x", &outside.display().to_string(), json!({}));
        let r = post(&url, &b, &[]).await;
        assert_eq!(
            (r.status, r.error_message()),
            (
                400,
                Some("The iac-code workspace is outside the allowed roots.")
            ),
            "{}",
            outside.display()
        );
        assert!(!outside.exists());
    }
    k.stream(Stream::of("task-1", &ctx("t1")).task("TASK_STATE_COMPLETED", json!({})));
    let ws = root.join("t1");
    let r = post_turn(&url, "t1", "r1", "x", &ws.display().to_string()).await;
    sse::assert_valid_run(&r, "t1", "r1");
    assert!(ws.is_dir());
    let _ = child.kill();
    let _ = child.wait();
}

/// The defaults end to end, as `scripts/run.sh` runs them: no configured root, a managed real
/// kernel; a turn in `<state-dir>/workspaces/…` is served (the kernel accepts the gateway's
/// default root as its own), and the process directory is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_root_serves_a_real_kernel_turn() {
    let env = testkit::real_kernel::KernelEnv::new().await;
    let here = env.dir.path().join("process-dir");
    // The kernel's own defaults (its directory, its temp directory) hold nothing of the state
    // dir: only the root the gateway hands it lets it take the turn.
    let tmp = here.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let port = free_port();
    let vars = env
        .vars()
        .into_iter()
        .filter(|(k, _)| !k.ends_with("_ALLOWED_CWDS"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_iac-code-agui"))
        .args(["--port", &port.to_string(), "--a2a-command", &env.command()])
        .arg("--state-dir")
        .arg(env.state_dir())
        .current_dir(&here)
        .env_remove("IAC_CODE_AGUI_ALLOWED_CWDS")
        .env_remove("IACCODE_A2A_ALLOWED_CWDS")
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .envs(vars)
        .env("TMPDIR", &tmp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/");
    let c = client();
    let start = std::time::Instant::now();
    loop {
        let ready = match c.get(format!("{url}health")).send().await {
            Ok(r) => {
                let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
                v["kernel"]["state"] == "ready"
            }
            Err(_) => false,
        };
        if ready {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "kernel never ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let root = env.state_dir().canonicalize().unwrap().join("workspaces");
    let cwd = root.join("d1").display().to_string();
    let r = post_turn(&url, "d1", "r1", "Hi. scenario:text", &cwd).await;
    sse::assert_valid_run(&r, "d1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    let outside = here.canonicalize().unwrap().join("w").display().to_string();
    let r = post_turn(&url, "d2", "r1", "Hi", &outside).await;
    assert_eq!(r.status, 400);
    let _ = child.kill();
    let _ = child.wait();
}
