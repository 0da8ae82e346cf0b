//! The console (`--console`): off unless asked; its page served with its policy while every
//! request it makes needs the token; and a person's path through it in headless Chromium
//! (`console/e2e/drive.mjs`, Debian's Chromium through puppeteer-core) against the real kernel:
//! sign in, send a turn, answer its permission interrupt with a click, the run's session once in
//! the thread's header (no chat line), the raw frames and their export, a reload that finds the
//! thread and its history. Screenshots go to
//! `<target>/tmp/console-artifacts/` (CI keeps them; never the repository).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use testkit::fake_llm::Plan;
use testkit::real_kernel::KernelEnv;

use crate::support::{get_as, http_get, managed, Builder, TestServer};

fn console_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../console")
}

#[tokio::test]
async fn the_console_is_off_unless_asked() {
    let s = Builder::new().start().await;
    for path in ["console", "console/", "console/app.js"] {
        let r = http_get(&format!("{}{path}", s.url)).await;
        assert_eq!(r.status(), 404, "{path}");
    }
}

/// On the main listener with a token: the page (code, no data) loads; what it asks for is 401
/// without the token, as for any client.
#[tokio::test]
async fn the_page_loads_and_everything_it_asks_needs_the_token() {
    let s = Builder::new().auth("tok").console().start().await;
    let r = http_get(&format!("{}console/", s.url)).await;
    assert_eq!(r.status(), 200);
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe"), "{csp}");
    let html = r.text().await.unwrap();
    assert!(html.contains("&quot;bearer&quot;"), "{html}");
    let r = http_get(&format!("{}console", s.url)).await;
    assert_eq!(r.status(), 200, "the redirect to /console/ is followed");
    for path in [
        "threads",
        "threads/t1/messages",
        "threads/t1/connect",
        "capabilities",
    ] {
        let (status, body) = get_as(&format!("{}{path}", s.url), &[]).await;
        assert_eq!(status, 401, "{path}: {body}");
        assert_eq!(body["error"]["code"], "UNAUTHORIZED");
    }
    let (status, _) = get_as(
        &format!("{}threads", s.url),
        &[("authorization", "Bearer tok")],
    )
    .await;
    assert_eq!(status, 200);
}

/// `--console admin`: not on the main listener; on the admin listener with the gateway's routes
/// behind it (the same authentication), `/metrics` still there; and a person's whole path
/// through it against the real kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_on_the_admin_listener_serves_the_same_path() {
    let env = KernelEnv::new().await;
    let s = gateway(&env, |b| b.console_on_admin()).await;
    let admin = s.admin_url.clone().expect("an admin listener");
    assert_eq!(http_get(&format!("{}console/", s.url)).await.status(), 404);
    let r = http_get(&format!("{admin}console/")).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("content-security-policy"));
    assert_eq!(http_get(&format!("{admin}metrics")).await.status(), 200);
    let (status, _) = get_as(&format!("{admin}threads"), &[]).await;
    assert_eq!(status, 401);
    let report = whole_path(
        &env,
        &format!("{admin}console/"),
        "c3",
        "console-admin-artifacts",
    )
    .await;
    // The strip links the metrics the listener serves beside the page.
    assert_eq!(report["metricsLink"], format!("{admin}metrics"), "{report}");
    assert_eq!(report["metricsStatus"], 200, "{report}");
}

/// A person's whole path through the console at `url` (the `console-token` token), in the
/// workspace `name`: it passes, the tool runs once; screenshots go to `artifacts` (under the
/// target's temporary directory). Returns the driver's report.
async fn whole_path(env: &KernelEnv, url: &str, name: &str, artifacts: &str) -> Value {
    let artifacts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(artifacts);
    let (ok, report) = drive(plan(
        env,
        url,
        name,
        json!({"prompt": "Run it. scenario:bash", "artifacts": artifacts, "timeoutMs": 120000}),
    ))
    .await;
    let cwd = env.ws().join(name);
    assert!(ok, "{}", serde_json::to_string_pretty(&report).unwrap());
    assert_eq!(
        std::fs::read_to_string(cwd.join("out.txt")).unwrap(),
        "agui-test\n",
        "the tool ran once"
    );
    for png in ["console-interrupt.png", "console-frames.png"] {
        let len = std::fs::metadata(artifacts.join(png)).map(|m| m.len()).ok();
        assert!(len.is_some_and(|n| n > 10_000), "{png}: {len:?}");
    }
    report
}

/// A gateway in front of a managed real kernel of `env`, with the `console-token` token, and what
/// `with` adds.
async fn gateway(env: &KernelEnv, with: impl FnOnce(Builder) -> Builder) -> TestServer {
    let kernel = managed(env).await;
    with(Builder::in_env(env).kernel(kernel).auth("console-token"))
        .start()
        .await
}

/// A driver's plan for the console at `url`: the token, the workspace `name` (made), a minute to
/// go, screenshots under the target's temporary directory, and `extra` (which wins).
/// The console on the main listener, runs going on for `grace` without a client.
fn detaching_console(b: Builder, grace: Duration) -> Builder {
    b.config(move |c| c.detach_grace = grace).console()
}

fn plan(env: &KernelEnv, url: &str, name: &str, extra: Value) -> Value {
    let cwd = env.ws().join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    let mut plan = json!({
        "url": url,
        "token": "console-token",
        "cwd": cwd.display().to_string(),
        "artifacts": PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-artifacts"),
        "timeoutMs": 60000,
    });
    for (k, v) in extra.as_object().expect("an object") {
        plan[k] = v.clone();
    }
    plan
}

async fn drive(plan: Value) -> (bool, Value) {
    let script = console_dir().join("e2e/drive.mjs");
    crate::support::browser_driver(&script, &console_dir(), &plan).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_chats_answers_an_interrupt_and_comes_back_in_the_console() {
    let env = KernelEnv::new().await;
    let s = gateway(&env, |b| b.console()).await;
    let report = whole_path(
        &env,
        &format!("{}console/", s.url),
        "c1",
        "console-artifacts",
    )
    .await;
    assert!(report["frames"].as_u64() > Some(5), "{report}");
    // The session (`iac-code.session.v1`, several a run) is the thread's: no chat line, its ids
    // once in the thread's header (the driver counts them in the chat column), each event a frame.
    let session = &report["session"];
    assert_eq!(session["lines"], json!([]), "{report}");
    assert!(
        session["header"]
            .as_str()
            .is_some_and(|h| h.contains("execution ")),
        "{report}"
    );
    assert!(session["frames"].as_u64() >= Some(4), "{report}");
    // No `/metrics` on the main listener: no link to one.
    assert_eq!(report["metricsLink"], Value::Null, "{report}");
}

/// With `--detach-grace`, a reload leaves a turn going; the reloaded console lists the thread as
/// running, and opening it shows the history and follows the run to its end (`connect`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_by_a_reload_is_followed_again_in_the_console() {
    let env = KernelEnv::new().await;
    let words: Vec<String> = (0..40).map(|i| format!("word{i} ")).collect();
    env.llm.script(
        "console-reattach",
        Plan {
            text: words.clone(),
            delay: Duration::from_millis(150),
            ..Plan::default()
        },
    );
    let s = gateway(&env, |b| detaching_console(b, Duration::from_secs(60))).await;
    let (ok, report) = drive(plan(
        &env,
        &format!("{}console/", s.url),
        "c2",
        json!({
            "mode": "reattach",
            "prompt": "Go on. scenario:console-reattach",
            "lastWords": words.last().unwrap().trim(),
        }),
    ))
    .await;
    assert!(ok, "{}", serde_json::to_string_pretty(&report).unwrap());
}

/// "Follow later runs": an opened thread's stream stays open and shows a run another client
/// starts on it (`connect?follow=true`; runs are buffered for it with `--detach-grace`), until
/// Stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_thread_shows_another_clients_run() {
    let env = KernelEnv::new().await;
    env.llm.script(
        "console-follow",
        Plan::text(&["Followed", " from", " elsewhere."]),
    );
    let s = gateway(&env, |b| detaching_console(b, Duration::from_secs(30))).await;
    let (ok, report) = drive(plan(
        &env,
        &format!("{}console/", s.url),
        "c4",
        json!({
            "mode": "follow",
            "prompt": "Hi. scenario:text",
            "second": "Again. scenario:console-follow",
            "followedWords": "Followed from elsewhere.",
        }),
    ))
    .await;
    assert!(ok, "{}", serde_json::to_string_pretty(&report).unwrap());
}
