//! Against the real kernel (`iac-code a2a` 0.16.0, pinned venv) driven by the scripted fake LLM.
//! These tests never skip: a missing kernel is a failure (run `scripts/kernel-venv.sh`).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kernel::Kernel;
use serde_json::{json, Value};
use testkit::fake_llm::Plan;
use testkit::real_kernel::{KernelEnv, KernelProcess};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::pool_real::signal;
use crate::support::{
    body, client, free_port, managed, managed_with, post_resume, post_turn, real, resume_body,
    server, spawn_post, Builder,
};

pub(crate) fn ws(env: &KernelEnv, name: &str) -> String {
    env.ws().join(name).display().to_string()
}

fn interrupt_ids(r: &RunResult) -> Vec<String> {
    r.last()["outcome"]["interrupts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| i["id"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn answer(r: &RunResult, decision: &str) -> Value {
    Value::Array(
        interrupt_ids(r)
            .into_iter()
            .map(|id| json!({"interruptId": id, "status": "resolved", "payload": {"decision": decision}}))
            .collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reasoning_second_turn_and_errors() {
    text_reasoning_second_turn_and_errors_on(false).await;
}

/// [`text_reasoning_second_turn_and_errors`] on a kernel forked by the kernel fork server (`--kernel-start fork`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_reasoning_second_turn_and_errors_on_a_forked_kernel() {
    text_reasoning_second_turn_and_errors_on(true).await;
}

async fn text_reasoning_second_turn_and_errors_on(forked: bool) {
    let env = KernelEnv::new().await;
    let s = server(&env, real(&env, forked).await).await;
    let w = ws(&env, "t1");
    // Plain text.
    let r1 = post_turn(&s.url, "t1", "r1", "Say hello. scenario:text", &w).await;
    assert_valid_run(&r1, "t1", "r1");
    assert_eq!(r1.last()["type"], "RUN_FINISHED", "{}", r1.raw);
    let text = r1.text();
    assert_eq!(text, "Hello from the fake LLM.");
    assert_eq!(r1.last()["usage"][0]["inputTokens"], 100);
    let s1 = (*r1.sessions().last().unwrap()).clone();
    assert!(s1["taskId"].is_string() && s1["sessionId"].is_string());
    // Second turn: new execution, same context and session, history visible to the LLM.
    let r2 = post_turn(&s.url, "t1", "r2", "Think. scenario:think", &w).await;
    assert_valid_run(&r2, "t1", "r2");
    let s2 = (*r2.sessions().last().unwrap()).clone();
    assert_ne!(s2["executionId"], s1["executionId"]);
    assert_eq!(s2["contextId"], s1["contextId"]);
    assert_eq!(s2["sessionId"], s1["sessionId"]);
    let t = r2.types();
    let rs = t
        .iter()
        .position(|x| x == "REASONING_START")
        .expect("reasoning");
    let ts = t
        .iter()
        .position(|x| x == "TEXT_MESSAGE_START")
        .expect("text");
    assert!(rs < ts);
    let reasoning: String = r2
        .of("REASONING_MESSAGE_CONTENT")
        .iter()
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(reasoning, "Let me think about this carefully.");
    let last_req = env
        .llm
        .requests()
        .into_iter()
        .rfind(|r| r.scenario == "think")
        .unwrap();
    let msgs = last_req.body["messages"].to_string();
    assert!(
        msgs.contains("Say hello. scenario:text") && msgs.contains("Hello from the fake LLM."),
        "history: {msgs}"
    );
    // An LLM provider error.
    let r3 = post_turn(&s.url, "t1", "r3", "Fail. scenario:error", &w).await;
    assert_valid_run(&r3, "t1", "r3");
    assert_eq!(r3.last()["type"], "RUN_ERROR", "{}", r3.raw);
    assert_eq!(r3.last()["code"], "A2A_EXECUTION_FAILED");
    // A read-only tool runs without a permission prompt.
    let r4 = post_turn(&s.url, "t1", "r4", "List. scenario:bashro", &w).await;
    assert_valid_run(&r4, "t1", "r4");
    assert_eq!(r4.last()["outcome"]["type"], "success", "{}", r4.raw);
    let t = r4.types();
    for e in [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ] {
        assert!(t.contains(&e.to_owned()), "{e}: {t:?}");
    }
    assert_eq!(
        r4.of("TOOL_CALL_ARGS")[0]["delta"],
        r#"{"command":"ls -la"}"#
    );

    // The thread's transcript holds the four runs as their client saw them.
    let (status, page) =
        crate::support::get_as(&format!("{}threads/t1/messages?limit=200", s.url), &[]).await;
    assert_eq!(status, 200, "{page}");
    let entries = page["entries"].as_array().unwrap();
    let of = |role: &str| -> Vec<&Value> {
        entries
            .iter()
            .map(|e| &e["message"])
            .filter(|m| m["role"] == role)
            .collect()
    };
    let asked: Vec<&Value> = of("user").iter().map(|m| &m["content"]).collect();
    assert_eq!(
        asked,
        [
            "Say hello. scenario:text",
            "Think. scenario:think",
            "Fail. scenario:error",
            "List. scenario:bashro"
        ]
    );
    let runs: Vec<&str> = entries
        .iter()
        .map(|e| e["runId"].as_str().unwrap())
        .collect();
    assert!(runs.windows(2).all(|w| w[0] <= w[1]), "{runs:?}");
    assert_eq!(of("assistant")[0]["content"], "Hello from the fake LLM.");
    assert_eq!(
        of("reasoning")[0]["content"],
        "Let me think about this carefully."
    );
    let error = of("activity")
        .into_iter()
        .find(|m| m["activityType"] == "iac-code.run-error")
        .expect("the failed run's error");
    assert_eq!(error["content"]["code"], "A2A_EXECUTION_FAILED");
    let call = of("assistant")
        .into_iter()
        .find_map(|m| m.get("toolCalls"))
        .expect("the tool call");
    assert_eq!(call[0]["function"]["arguments"], r#"{"command":"ls -la"}"#);
    let result = &of("tool")[0];
    assert_eq!(result["content"], r4.of("TOOL_CALL_RESULT")[0]["content"]);
    assert_eq!(result["toolCallId"], call[0]["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_allow_deny_cancelled_and_replay() {
    permission_allow_deny_cancelled_and_replay_on(false).await;
}

/// [`permission_allow_deny_cancelled_and_replay`] on a kernel forked by the kernel fork server (`--kernel-start fork`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_allow_deny_cancelled_and_replay_on_a_forked_kernel() {
    permission_allow_deny_cancelled_and_replay_on(true).await;
}

async fn permission_allow_deny_cancelled_and_replay_on(forked: bool) {
    let env = KernelEnv::new().await;
    let s = server(&env, real(&env, forked).await).await;
    let w = ws(&env, "p1");
    let r1 = post_turn(&s.url, "p1", "r1", "Run it. scenario:bash", &w).await;
    assert_valid_run(&r1, "p1", "r1");
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    let i = &r1.last()["outcome"]["interrupts"][0];
    assert_eq!(i["reason"], "tool_call");
    assert!(i["toolCallId"].is_string() && i["expiresAt"].is_string());
    assert_eq!(i["metadata"]["kind"], "permission");
    // A schema-invalid payload, then a valid retry.
    let bad = resume_body(
        "p1",
        "r2",
        &w,
        "inv-1",
        json!([{"interruptId": interrupt_ids(&r1)[0], "status": "resolved", "payload": {"decision": "maybe"}}]),
    );
    let r2 = post(&s.url, &bad, &[]).await;
    assert_valid_run(&r2, "p1", "r2");
    assert_eq!(r2.last()["code"], "RESUME_PAYLOAD_INVALID");
    let good = resume_body("p1", "r3", &w, "inv-1", answer(&r1, "allow_once"));
    let r3 = post(&s.url, &good, &[]).await;
    assert_valid_run(&r3, "p1", "r3");
    assert_eq!(r3.last()["outcome"]["type"], "success", "{}", r3.raw);
    assert!(r3.of("TOOL_CALL_RESULT")[0]["content"]
        .as_str()
        .unwrap()
        .contains("agui-test"));
    let out = std::path::Path::new(&w).join("out.txt");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "agui-test\n");
    // The same resume replayed: RESUME_ALREADY_APPLIED, and the tool did not run twice.
    let again = resume_body("p1", "r4", &w, "inv-1", answer(&r1, "allow_once"));
    let r4 = post(&s.url, &again, &[]).await;
    assert_eq!(r4.last()["code"], "RESUME_ALREADY_APPLIED");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "agui-test\n");

    // deny, with preferredLanguage zh reaching the kernel (its refusal text is Chinese).
    let w2 = ws(&env, "p2");
    let r5 = post(
        &s.url,
        &body(
            "p2",
            "r1",
            "Run it. scenario:bash",
            &w2,
            json!({"preferredLanguage": "zh"}),
        ),
        &[],
    )
    .await;
    assert_eq!(r5.last()["outcome"]["type"], "interrupt", "{}", r5.raw);
    let r6 = post_resume(&s.url, "p2", "r2", &w2, "inv-1", answer(&r5, "deny")).await;
    assert_valid_run(&r6, "p2", "r2");
    assert_eq!(r6.last()["outcome"]["type"], "success", "{}", r6.raw);
    let refusal = r6.of("TOOL_CALL_RESULT")[0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        refusal
            .chars()
            .any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c)),
        "{refusal}"
    );
    assert!(!std::path::Path::new(&w2).join("out.txt").exists());

    // cancelled → deny.
    let w3 = ws(&env, "p3");
    let r7 = post_turn(&s.url, "p3", "r1", "Run it. scenario:bash", &w3).await;
    let cancel = json!([{"interruptId": interrupt_ids(&r7)[0], "status": "cancelled"}]);
    let r8 = post_resume(&s.url, "p3", "r2", &w3, "inv-1", cancel).await;
    assert_valid_run(&r8, "p3", "r2");
    assert_eq!(r8.last()["outcome"]["type"], "success", "{}", r8.raw);
    assert!(!std::path::Path::new(&w3).join("out.txt").exists());

    // Two tool calls in one message: two consecutive interrupts, then both results.
    let w4 = ws(&env, "p4");
    let a = post_turn(&s.url, "p4", "r1", "Two. scenario:bash2", &w4).await;
    assert_eq!(a.last()["outcome"]["type"], "interrupt", "{}", a.raw);
    assert_eq!(a.of("TOOL_CALL_START").len(), 2);
    let b = post_resume(&s.url, "p4", "r2", &w4, "inv-1", answer(&a, "allow_once")).await;
    assert_valid_run(&b, "p4", "r2");
    assert_eq!(b.last()["outcome"]["type"], "interrupt", "{}", b.raw);
    assert_ne!(interrupt_ids(&a), interrupt_ids(&b));
    let c = post_resume(&s.url, "p4", "r3", &w4, "inv-1", answer(&b, "allow_once")).await;
    assert_valid_run(&c, "p4", "r3");
    assert_eq!(c.last()["outcome"]["type"], "success", "{}", c.raw);
    assert_eq!(c.of("TOOL_CALL_RESULT").len(), 2, "{}", c.raw);
    assert!(std::path::Path::new(&w4).join("first.txt").exists());
    assert!(std::path::Path::new(&w4).join("second.txt").exists());

    // write_file permission survives a gateway restart.
    let w5 = ws(&env, "p5");
    let r9 = post_turn(&s.url, "p5", "r1", "Write. scenario:write", &w5).await;
    assert_eq!(r9.last()["outcome"]["type"], "interrupt", "{}", r9.raw);
    // Gateway restart; its managed kernel restarts too (the wait is durable in the kernel).
    s.stop().await;
    let kernel = managed(&env).await;
    let s = server(&env, kernel).await;
    let r10 = post_resume(&s.url, "p5", "r2", &w5, "inv-1", answer(&r9, "allow_once")).await;
    assert_valid_run(&r10, "p5", "r2");
    assert_eq!(r10.last()["outcome"]["type"], "success", "{}", r10.raw);
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&w5).join("note.txt")).unwrap(),
        "hello\n"
    );
}

async fn task_state(kernel: &Kernel, task: &str) -> String {
    let c = kernel.client().unwrap();
    let t = c.get_task(task, 0).await.unwrap();
    t.as_value()["status"]["state"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_endpoint_disconnect_and_heartbeat() {
    let env = KernelEnv::new().await;
    // The stream watchdog (16 s) is shorter than the LLM's 17 s stall: only the kernel's
    // 15 s pings keep the stream alive, so this also proves they reset the watchdog.
    let kernel = managed_with(
        &env,
        a2a::Timeouts {
            stream_idle: Duration::from_secs(16),
            ..a2a::Timeouts::default()
        },
    )
    .await;
    let s = server(&env, kernel.clone()).await;
    let w = ws(&env, "c1");
    // Cancel endpoint during a slow run.
    let run = spawn_post(
        &s.url,
        body("c1", "r1", "Slow. scenario:slow", &w, json!({})),
    );
    let start = Instant::now();
    let (exec, task) = loop {
        let doc = std::fs::read(s.thread_file("c1"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if let Some(d) = doc {
            if let Some(t) = d["execution"]["taskId"].as_str() {
                break (
                    d["execution"]["executionId"].as_str().unwrap().to_owned(),
                    t.to_owned(),
                );
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "task id never persisted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = s.cancel(&exec, "c1", "inv-1").await;
    assert_eq!(c.json.unwrap()["status"], "cancelled");
    let r = run.await.unwrap();
    assert_valid_run(&r, "c1", "r1");
    assert_eq!(r.last()["code"], "CANCELLED", "{}", r.raw);
    assert_eq!(task_state(&kernel, &task).await, "TASK_STATE_CANCELED");
    let c = s.cancel(&exec, "c1", "inv-1").await;
    assert_eq!(c.json.unwrap()["status"], "already_terminal");

    // Client disconnect: the kernel task is cancelled and the LLM stream stops.
    let client = client();
    let resp = client
        .post(&s.url)
        .header("content-type", "application/json")
        .body(body("c1", "r2", "Slow again. scenario:slow", &w, json!({})).to_string())
        .send()
        .await
        .unwrap();
    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("TEXT_MESSAGE_CONTENT") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    drop(stream);
    let doc: Value = serde_json::from_slice(&std::fs::read(s.thread_file("c1")).unwrap()).unwrap();
    let task2 = doc["execution"]["taskId"].as_str().map(str::to_owned);
    let start = Instant::now();
    let task2 = match task2 {
        Some(t) => t,
        None => panic!("task id not persisted before disconnect"),
    };
    loop {
        if task_state(&kernel, &task2).await == "TASK_STATE_CANCELED" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "task not cancelled after disconnect"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Heartbeat after 15 s of kernel silence (the LLM stalls 17 s).
    let r = post_turn(&s.url, "c1", "r3", "Stall. scenario:stall", &w).await;
    assert_valid_run(&r, "c1", "r3");
    assert!(r.heartbeats >= 1, "{}", r.raw);
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
}

pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
        let ppid: u32 = after
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        if ppid == pid {
            out.push(p);
            out.extend(descendants(p));
        }
    }
    out
}

pub(crate) fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .map(|x| x.1)
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

pub(crate) async fn gateway_process(env: &KernelEnv, extra: &[&str]) -> (std::process::Child, u16) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_iac-code-agui"))
        .args([
            "--port",
            &port.to_string(),
            "--a2a-command",
            &env.command(),
            "--state-dir",
        ])
        .arg(env.state_dir())
        .args(extra)
        .envs(env.vars())
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (child, port)
}

async fn wait_kernel_ready(port: u16) -> Value {
    crate::pool_real::pool_ready(port, 1).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_kernel_starts_serves_and_never_leaks() {
    let env = KernelEnv::new().await;
    // SIGTERM: the kernel is stopped with the gateway.
    let (mut gw, port) = gateway_process(&env, &[]).await;
    let health = wait_kernel_ready(port).await;
    assert_eq!(health["kernel"]["mode"], "managed");
    let kids = descendants(gw.id());
    assert!(!kids.is_empty());
    let r = post_turn(
        &format!("http://127.0.0.1:{port}/"),
        "m1",
        "r1",
        "Hi. scenario:text",
        &ws(&env, "m1"),
    )
    .await;
    assert_valid_run(&r, "m1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    signal(gw.id() as i32, libc::SIGTERM);
    let status = gw.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    for k in &kids {
        assert!(
            !alive(*k),
            "kernel process {k} survived SIGTERM of the gateway"
        );
    }
    // kill -9: the parent-death signal takes the kernel down.
    let (mut gw, port) = gateway_process(&env, &[]).await;
    wait_kernel_ready(port).await;
    let kids = descendants(gw.id());
    assert!(!kids.is_empty());
    gw.kill().unwrap();
    let _ = gw.wait();
    let start = Instant::now();
    while kids.iter().any(|k| alive(*k)) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "kernel orphaned after kill -9"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_kernel_via_a2a_url() {
    let env = KernelEnv::new().await;
    // Started as a managed kernel is, but by the test: the gateway only has its URL and token.
    let kernel = KernelProcess::start(&env).await;
    let url = kernel.url();
    env.llm.script("custom", Plan::text(&["Custom", " plan."]));
    let s = Builder::in_env(&env)
        .a2a(&url, Some(kernel.token.as_str()))
        .start()
        .await;
    let r = post_turn(&s.url, "e1", "r1", "Go. scenario:custom", &ws(&env, "e1")).await;
    assert_valid_run(&r, "e1", "r1");
    let text = r.text();
    assert_eq!(text, "Custom plan.");
}

/// The managed kernel dies mid-run: the run ends with A2A_UNAVAILABLE, the kernel is restarted
/// with back-off, `/health` reports it, and the next turn works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_kernel_crash_is_reported_and_restarted() {
    let env = KernelEnv::new().await;
    let kernel = managed(&env).await;
    let s = server(&env, kernel.clone()).await;
    let w = ws(&env, "k1");
    let run = spawn_post(
        &s.url,
        body("k1", "r1", "Slow. scenario:slow", &w, json!({})),
    );
    let start = Instant::now();
    while !std::fs::read(s.thread_file("k1"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|d| d["execution"]["taskId"].is_string())
    {
        assert!(start.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pid = kernel.health()["pid"].as_u64().unwrap() as i32;
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall on the kernel's process group.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
    let r = run.await.unwrap();
    assert_valid_run(&r, "k1", "r1");
    assert_eq!(r.last()["code"], "A2A_UNAVAILABLE", "{}", r.raw);
    assert_eq!(
        crate::support::metric(
            &s,
            "agui_runs_finished_total{outcome=\"error\",code=\"A2A_UNAVAILABLE\"}"
        ),
        1.0
    );
    let mut seen_down = false;
    let mut seen_unready = false;
    let start = Instant::now();
    loop {
        let h = kernel.health();
        // The metrics say what /health says: down while it restarts, then up, one restart.
        let up = crate::support::metric(&s, "agui_kernel_up");
        seen_down |= up == 0.0;
        // So does /ready, which a process manager asks.
        let (status, ready) = crate::support::get_as(&format!("{}ready", s.url), &[]).await;
        seen_unready |=
            status == 503 && ready == json!({"status": "unready", "reasons": ["kernel"]});
        if h["state"] == "ready" && h["restarts"].as_u64() >= Some(1) && up == 1.0 {
            assert!(seen_down, "agui_kernel_up never went to 0");
            assert!(seen_unready, "/ready never said the kernel was not ready");
            let (status, ready) = crate::support::get_as(&format!("{}ready", s.url), &[]).await;
            assert_eq!((status, ready), (200, json!({"status": "ready"})));
            assert!(crate::support::metric(&s, "agui_kernel_restarts_total") >= 1.0);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "kernel not restarted: {h}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = post_turn(&s.url, "k1", "r2", "Hi. scenario:text", &w).await;
    assert_valid_run(&r, "k1", "r2");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
}

fn pipeline_props() -> Value {
    json!({"runMode": "pipeline", "pipelineName": "selling"})
}

/// A pipeline resume: the same per-request options as the run it answers.
fn pipeline_resume(thread: &str, run: &str, cwd: &str, entries: Value) -> Value {
    let mut b = resume_body(thread, run, cwd, "inv-1", entries);
    b["forwardedProps"]["iacCode"]["runMode"] = json!("pipeline");
    b["forwardedProps"]["iacCode"]["pipelineName"] = json!("selling");
    b
}

/// A pipeline run asks a question (interrupt with options), is resumed with an option, with free
/// text, after a gateway restart (ACTIVITY_SNAPSHOT and the re-opened step), and cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_question_interrupts_and_resumes() {
    pipeline_question_interrupts_and_resumes_on(false).await;
}

/// [`pipeline_question_interrupts_and_resumes`] on a kernel forked by the kernel fork server (`--kernel-start fork`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_question_interrupts_and_resumes_on_a_forked_kernel() {
    pipeline_question_interrupts_and_resumes_on(true).await;
}

async fn pipeline_question_interrupts_and_resumes_on(forked: bool) {
    let env = KernelEnv::new().await;
    let s = server(&env, real(&env, forked).await).await;
    let start_run = |thread: &'static str| {
        let url = s.url.clone();
        let w = ws(&env, thread);
        async move {
            post(
                &url,
                &body(
                    thread,
                    "r1",
                    "Hello there. scenario:pipeline",
                    &w,
                    pipeline_props(),
                ),
                &[],
            )
            .await
        }
    };
    // (a) selected option.
    let r1 = start_run("pl1").await;
    assert_valid_run(&r1, "pl1", "r1");
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    let t = r1.types();
    assert!(
        t.contains(&"CUSTOM(iac-code.pipeline.v1)".to_owned()),
        "{t:?}"
    );
    assert!(t.iter().any(|x| x.starts_with("STEP_STARTED(")), "{t:?}");
    let i = &r1.last()["outcome"]["interrupts"][0];
    assert_eq!(i["reason"], "input_required");
    assert_eq!(i["metadata"]["kind"], "ask_user_question");
    let consts: Vec<&str> = i["responseSchema"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["properties"]["selectedId"]["const"].as_str())
        .collect();
    assert_eq!(consts, ["alibaba", "none"]);
    assert!(i["message"]
        .as_str()
        .unwrap()
        .contains("- none: Not a deployment request"));
    let id = i["id"].as_str().unwrap().to_owned();
    let resume =
        json!([{"interruptId": id, "status": "resolved", "payload": {"selectedId": "none"}}]);
    let r2 = post(
        &s.url,
        &pipeline_resume("pl1", "r2", &ws(&env, "pl1"), resume),
        &[],
    )
    .await;
    assert_valid_run(&r2, "pl1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    let t2 = r2.types();
    assert!(
        t2.iter().any(|x| x.starts_with("STEP_STARTED(")),
        "re-opened step: {t2:?}"
    );
    assert!(t2.contains(&"ACTIVITY_SNAPSHOT".to_owned()), "{t2:?}");
    assert!(
        r2.of("TOOL_CALL_RESULT")
            .iter()
            .any(|e| e["content"] == "Not a deployment request"),
        "{}",
        r2.raw
    );
    let customs: Vec<&Value> = r2
        .events
        .iter()
        .filter(|e| e["name"] == "iac-code.pipeline.v1")
        .collect();
    assert!(
        customs
            .iter()
            .any(|e| e["value"]["eventType"] == "pipeline_completed"),
        "{}",
        r2.raw
    );
    // The kernel received the option's label as the answer.
    let asked = env
        .llm
        .requests()
        .into_iter()
        .filter(|r| r.body.to_string().contains("Not a deployment request"))
        .count();
    assert!(asked > 0);

    // (b) free text, after a gateway restart (its managed kernel restarts too).
    let r3 = start_run("pl2").await;
    assert_eq!(r3.last()["outcome"]["type"], "interrupt", "{}", r3.raw);
    let id = r3.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    s.stop().await;
    let s = server(&env, managed(&env).await).await;
    let resume = json!([{"interruptId": id, "status": "resolved", "payload": {"freeText": "Just saying hi"}}]);
    let r4 = post(
        &s.url,
        &pipeline_resume("pl2", "r2", &ws(&env, "pl2"), resume),
        &[],
    )
    .await;
    assert_valid_run(&r4, "pl2", "r2");
    assert_eq!(
        r4.events[1]["type"], "STEP_STARTED",
        "the durable step re-opens first: {}",
        r4.raw
    );
    assert!(
        r4.types().contains(&"ACTIVITY_SNAPSHOT".to_owned()),
        "{}",
        r4.raw
    );
    let snap = &r4.of("ACTIVITY_SNAPSHOT")[0];
    assert_eq!(snap["activityType"], "iac-code.pipeline.v1");
    assert_eq!(snap["replace"], true);
    assert!(snap["content"]["snapshot"].is_object());
    assert_eq!(r4.last()["outcome"]["type"], "success", "{}", r4.raw);

    // (c) cancelled question → the task is cancelled.
    let url = s.url.clone();
    let w3 = ws(&env, "pl3");
    let r5 = post(
        &url,
        &body(
            "pl3",
            "r1",
            "Hello there. scenario:pipeline",
            &w3,
            pipeline_props(),
        ),
        &[],
    )
    .await;
    let id = r5.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let r6 = post(
        &url,
        &pipeline_resume(
            "pl3",
            "r2",
            &w3,
            json!([{"interruptId": id, "status": "cancelled"}]),
        ),
        &[],
    )
    .await;
    assert_valid_run(&r6, "pl3", "r2");
    assert_eq!(r6.last()["code"], "CANCELLED", "{}", r6.raw);
}

/// With `--detach-grace`, through the real kernel: a client that drops re-attaches after the last
/// id it saw and gets the rest of the run (joined: one whole, valid run); a run nobody re-attaches
/// to has its kernel task cancelled once the grace has run out, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_runs_reattach_or_expire_through_the_real_kernel() {
    use futures_util::StreamExt;
    let env = KernelEnv::new().await;
    let kernel = managed(&env).await;
    let s = Builder::in_env(&env)
        .kernel(kernel.clone())
        .config(move |c| c.detach_grace = Duration::from_secs(3))
        .start()
        .await;
    let client = client();
    // Starts a run and drops it once text flows; returns the whole blocks seen.
    let start_and_drop = |thread: &'static str, message: &'static str| {
        let (client, url, w) = (client.clone(), s.url.clone(), ws(&env, thread));
        async move {
            let resp = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body(thread, "r1", message, &w, json!({})).to_string())
                .send()
                .await
                .unwrap();
            let mut stream = resp.bytes_stream();
            let mut seen = String::new();
            while !seen.contains("TEXT_MESSAGE_CONTENT") || !seen.ends_with("\n\n") {
                seen.push_str(&String::from_utf8_lossy(
                    &stream.next().await.unwrap().unwrap(),
                ));
            }
            seen
        }
    };
    let seen = start_and_drop("d1", "Steady. scenario:steady").await;
    let last = testkit::sse::event_ids(&seen)
        .last()
        .copied()
        .flatten()
        .unwrap();
    let rest = client
        .get(format!("{}threads/d1/runs/r1/events", s.url))
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (events, heartbeats) = testkit::sse::parse(&format!("{seen}{rest}"));
    let joined = testkit::sse::RunResult {
        status: 200,
        content_type: String::new(),
        headers: vec![],
        events,
        heartbeats,
        raw: format!("{seen}{rest}"),
        json: None,
    };
    assert_valid_run(&joined, "d1", "r1");
    assert_eq!(
        joined.last()["outcome"]["type"],
        "success",
        "{}",
        joined.raw
    );
    let text = joined.text();
    assert!(text.contains("step0") && text.contains("step23"), "{text}");

    // Nobody re-attaches: cancelled after the grace.
    let _ = start_and_drop("d2", "Slow. scenario:slow").await;
    let dropped = Instant::now();
    let task = s.thread_doc("d2")["execution"]["taskId"]
        .as_str()
        .unwrap()
        .to_owned();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        task_state(&kernel, &task).await,
        "TASK_STATE_WORKING",
        "cancelled within the grace"
    );
    loop {
        if task_state(&kernel, &task).await == "TASK_STATE_CANCELED" {
            break;
        }
        assert!(
            dropped.elapsed() < Duration::from_secs(20),
            "not cancelled after the grace"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(dropped.elapsed() >= Duration::from_secs(3));
}

/// The state files stay the reference's: iac-code 0.16.0's own adapter (`iac-code agui`, from
/// the kernel's venv) loads the documents this gateway wrote, its additions
/// (`execution.lastTaskId`, `execution.messageIds`, `lastRun`, …) included: a thread waiting at a
/// permission, with its task and pending interrupt, and one whose execution ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_adapter_reads_the_state_files_this_gateway_writes() {
    let env = KernelEnv::new().await;
    let s = server(&env, managed(&env).await).await;
    let waiting = post_turn(
        &s.url,
        "py1",
        "r1",
        "Run it. scenario:bash",
        &ws(&env, "py1"),
    )
    .await;
    assert_eq!(
        waiting.last()["outcome"]["type"],
        "interrupt",
        "{}",
        waiting.raw
    );
    let done = post_turn(
        &s.url,
        "py2",
        "r1",
        "Say hello. scenario:text",
        &ws(&env, "py2"),
    )
    .await;
    assert_eq!(done.last()["outcome"]["type"], "success", "{}", done.raw);
    let py1 = s.thread_doc("py1");
    let py2 = s.thread_doc("py2");
    assert!(py1["execution"]["messageIds"].is_array(), "{py1}");
    assert!(py2["execution"]["lastTaskId"].is_string(), "{py2}");
    let script = r#"
import json, sys
from iac_code.agui.adapter import AguiA2AAdapter
adapter = AguiA2AAdapter(a2a_url="http://127.0.0.1:9/", state_dir=sys.argv[1])
out = {}
for thread in sys.argv[2:]:
    b = adapter._load_thread(thread)
    out[thread] = {"executionId": b.execution_id, "taskId": b.task_id,
                   "pending": sorted(b.pending), "runs": sorted(b.run_digests)}
print(json.dumps(out))
"#;
    let python = testkit::real_kernel::kernel_bin_dir().join("python");
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .arg(s.state_dir())
        .args(["py1", "py2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pending = interrupt_ids(&waiting);
    assert_eq!(
        read["py1"],
        json!({"executionId": py1["execution"]["executionId"], "taskId": py1["execution"]["taskId"],
               "pending": pending, "runs": ["r1"]})
    );
    assert_eq!(
        read["py2"],
        json!({"executionId": py2["execution"]["executionId"], "taskId": null, "pending": [],
               "runs": ["r1"]})
    );
}
