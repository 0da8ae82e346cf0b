//! Operability against the real tools: a real Prometheus scrapes the admin listener after real
//! kernel runs, `promtool` checks the exposition and the alert rules, an OTLP receiver decodes
//! the exported spans (tree, continued trace, the `traceparent` the kernel got), an exporter in
//! trouble never slows a run, and JSON logs carry the run's ids and one access line per request.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use engine::telemetry::Telemetry as _;
use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Item, Stream};
use testkit::otlp::{OtlpReceiver, Span};
use testkit::prometheus::{promtool, Prometheus};
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post};

use crate::support::{
    client, ctx, free_port, gateway_command, http_get, post_turn, post_turn_as, resume_body,
    spawn_healthy,
};

/// The repository root (for `ops/`).
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A gateway process with its output captured in `log`.
struct Gateway {
    child: Child,
    port: u16,
    admin: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Gateway {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn admin(&self) -> String {
        format!("127.0.0.1:{}", self.admin)
    }

    /// Stops it (SIGTERM, which flushes the trace queue) and returns what it logged.
    fn stop(mut self) -> String {
        #[allow(unsafe_code)]
        // SAFETY: plain kill syscall.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary with `args` and `env`, an admin listener, its logs in a file.
async fn gateway(args: &[&str], env: &[(String, String)]) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let (port, admin) = (free_port(), free_port());
    let log = dir.path().join("gateway.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = spawn_healthy(
        gateway_command(port, &dir.path().join("state"))
            .args(["--metrics-listen", &format!("127.0.0.1:{admin}")])
            .args(args)
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .envs(env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(out),
        port,
        Duration::from_secs(20),
    );
    Gateway {
        child,
        port,
        admin,
        log,
        _dir: dir,
    }
}

/// The exposition in the Prometheus text format, as a map `name{labels}` → value.
async fn scrape(admin: &str) -> (String, HashMap<String, f64>) {
    let text = http_get(format!("http://{admin}/metrics"))
        .await
        .text()
        .await
        .unwrap();
    let values = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect();
    (text, values)
}

fn promtool_ok(args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut p = Command::new(promtool())
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (scripts/test.sh installs Debian's prometheus package)");
    if let Some(s) = stdin {
        p.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    } else {
        drop(p.stdin.take());
    }
    let out = p.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}: {text}");
    text
}

fn value(samples: &[Value]) -> f64 {
    samples
        .first()
        .and_then(|s| s["value"][1].as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Real kernel, real Prometheus: a text turn, a permission interrupt answered, a refused
/// request; the families say so, PromQL over the scraped series says so, and `promtool` accepts
/// the exposition. The public port has no `/metrics`; the admin port has nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_what_real_kernel_runs_did() {
    let env = KernelEnv::new().await;
    let kernel_ws = |name: &str| env.ws().join(name).display().to_string();
    // The runs' traces too, of the real kernel's calls.
    let traces = OtlpReceiver::start().await;
    let mut vars = env.vars();
    vars.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), traces.endpoint()));
    vars.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
    let gw = gateway(&["--a2a-command", &env.command()], &vars).await;
    let c = client();
    // The kernel starts in the background.
    let start = Instant::now();
    loop {
        let h = c
            .get(format!("{}health", gw.url()))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let h: Value = serde_json::from_slice(&h).unwrap();
        if h["kernel"]["state"] == "ready" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "kernel never ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prom = Prometheus::start(&gw.admin()).await;

    let r = post_turn(&gw.url(), "m1", "r1", "Hi. scenario:text", &kernel_ws("m1")).await;
    assert_valid_run(&r, "m1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    let r1 = post_turn(
        &gw.url(),
        "m2",
        "r1",
        "Run it. scenario:bash",
        &kernel_ws("m2"),
    )
    .await;
    assert_valid_run(&r1, "m2", "r1");
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    let (_, during) = scrape(&gw.admin()).await;
    assert_eq!(during["agui_pending_interrupts"], 1.0);
    let id = r1.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let resume = resume_body(
        "m2",
        "r2",
        &kernel_ws("m2"),
        "inv-1",
        json!([{"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}]),
    );
    let r2 = post(&gw.url(), &resume, &[]).await;
    assert_valid_run(&r2, "m2", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    let refused = c
        .post(gw.url())
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);

    // What the gateway counted, read straight from the exposition.
    let (text, m) = scrape(&gw.admin()).await;
    promtool_ok(&["check", "metrics"], Some(&text));
    let events: f64 = [&r, &r1, &r2].iter().map(|r| r.events.len() as f64).sum();
    let sent: f64 = m
        .iter()
        .filter(|(k, _)| k.starts_with("agui_events_sent_total{"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(sent, events, "every event sent is counted once");
    let content = r.of("TEXT_MESSAGE_CONTENT").len()
        + r1.of("TEXT_MESSAGE_CONTENT").len()
        + r2.of("TEXT_MESSAGE_CONTENT").len();
    assert_eq!(
        m["agui_events_sent_total{type=\"TEXT_MESSAGE_CONTENT\"}"],
        content as f64
    );
    assert_eq!(m["agui_runs_started_total"], 3.0);
    assert_eq!(
        m["agui_runs_finished_total{outcome=\"success\",code=\"\"}"],
        2.0
    );
    assert_eq!(
        m["agui_runs_finished_total{outcome=\"interrupt\",code=\"\"}"],
        1.0
    );
    assert_eq!(m["agui_active_runs"], 0.0);
    assert_eq!(m["agui_pending_interrupts"], 0.0);
    assert_eq!(m["agui_interrupts_total{event=\"created\"}"], 1.0);
    assert_eq!(m["agui_interrupts_total{event=\"resolved\"}"], 1.0);
    assert_eq!(m["agui_admission_duration_seconds_count"], 3.0);
    assert!(m["agui_state_save_duration_seconds_count"] >= 4.0);
    assert_eq!(m["agui_state_save_failures_total"], 0.0);
    assert_eq!(m["agui_kernel_up"], 1.0);
    assert_eq!(m["agui_kernel_restarts_total"], 0.0);
    assert!(
        m["agui_kernel_request_duration_seconds_count{method=\"SendStreamingMessage\"}"] >= 3.0
    );
    assert_eq!(
        m["agui_http_requests_total{route=\"/\",status=\"200\"}"],
        3.0
    );
    assert_eq!(
        m["agui_http_requests_total{route=\"/\",status=\"400\"}"],
        1.0
    );
    assert_eq!(
        m[&format!(
            "agui_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )],
        1.0
    );
    for id in ["m1", "m2", "r1", "r2"] {
        assert!(
            !text.contains(&format!("\"{id}\"")),
            "no id in any label: {id}"
        );
    }

    // The same through Prometheus: scraped, stored, queried.
    let up = prom
        .wait_for("up{job=\"gateway\"}", Duration::from_secs(30), |v| v == 1.0)
        .await;
    assert_eq!(value(&up), 1.0, "{up:?}");
    let done = prom
        .wait_for(
            "sum(agui_runs_finished_total)",
            Duration::from_secs(30),
            |v| v >= 3.0,
        )
        .await;
    assert_eq!(value(&done), 3.0, "{done:?}");
    let by_outcome = prom
        .query("sum by (outcome) (agui_runs_finished_total)")
        .await;
    assert_eq!(by_outcome.len(), 2, "{by_outcome:?}");
    let p99 = prom
        .wait_for(
            "histogram_quantile(0.99, sum by (le) (agui_admission_duration_seconds_bucket))",
            Duration::from_secs(10),
            |v| v > 0.0 && v < 10.0,
        )
        .await;
    assert!(value(&p99) > 0.0, "{p99:?}");
    let kernel = prom.query("agui_kernel_up").await;
    assert_eq!(value(&kernel), 1.0);

    // Only the admin listener has /metrics, and it has nothing else but /health (a probe that
    // answers while the public listener is full).
    for (url, status) in [
        (format!("{}metrics", gw.url()), 404),
        (format!("http://{}/threads/t1", gw.admin()), 404),
        (format!("http://{}/health", gw.admin()), 200),
    ] {
        assert_eq!(c.get(&url).send().await.unwrap().status(), status, "{url}");
    }
    let open = c
        .get(format!("http://{}/metrics", gw.admin()))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    assert!(open.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(open.text().await.unwrap().ends_with("# EOF\n"));
    gw.stop();
    // One span tree per run: the turn's stream, and the resume's task lookup and answer.
    let spans = traces.spans();
    let run = |thread: &str, run: &str| {
        spans
            .iter()
            .find(|s| {
                s.name == "agui.run"
                    && s.attr("thread_id") == Some(&json!(thread))
                    && s.attr("run_id") == Some(&json!(run))
            })
            .unwrap_or_else(|| panic!("no span of {thread}/{run}: {spans:#?}"))
    };
    let calls = |root: &Span| -> Vec<String> {
        descendants(&spans, root)
            .iter()
            .filter(|s| s.kind == 3)
            .map(|s| s.name.clone())
            .collect()
    };
    let turn = run("m1", "r1");
    assert_eq!(turn.attr("outcome"), Some(&json!("success")));
    assert_eq!(turn.attr("mode"), Some(&json!("turn")));
    assert!(
        calls(turn).contains(&"SendStreamingMessage".to_owned()),
        "{:?}",
        calls(turn)
    );
    let resume = run("m2", "r2");
    assert_eq!(resume.attr("mode"), Some(&json!("resume")));
    let resumed = calls(resume);
    for call in ["ensure-restored", "GetTask", "SendStreamingMessage"] {
        assert!(
            resumed.contains(&call.to_owned()),
            "{call} missing: {resumed:?}"
        );
    }
    assert_eq!(run("m2", "r1").attr("outcome"), Some(&json!("interrupt")));
}

/// The alert rules and the dashboard in `ops/` are what Prometheus and Grafana read: promtool
/// checks the rules and runs their unit tests (each alert fires on its condition and stays
/// quiet otherwise); the dashboard's queries name only families the gateway has.
#[tokio::test]
async fn the_ops_rules_and_dashboard_stand() {
    promtool_ok(&["check", "rules", "ops/prometheus/alerts.yml"], None);
    promtool_ok(&["test", "rules", "ops/prometheus/alerts.test.yml"], None);
    // Every family, each with a sample (a family nobody used yet is not exposed).
    #[derive(Debug)]
    struct Up;
    impl iac_code_agui::telemetry::KernelGauges for Up {
        fn up(&self) -> bool {
            true
        }
        fn restarts(&self) -> u64 {
            0
        }
    }
    let m = iac_code_agui::telemetry::Metrics::new();
    m.watch_kernel(std::sync::Arc::new(Up));
    m.run_started();
    m.run_finished(
        iac_code_agui::telemetry::RunOutcome::Error,
        Some(iac_code_agui::error::Code::A2aUnavailable),
        Duration::from_millis(1),
    );
    m.kernel_request("GetTask", Duration::from_millis(1));
    m.http_request("/", 200);
    let families = m.encode();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("ops/grafana/iac-code-agui.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = vec![];
    for panel in dashboard["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let prefix_of = |name: &str| {
        ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name)
            .to_owned()
    };
    for e in &exprs {
        for name in e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("agui_"))
        {
            let family = prefix_of(name);
            assert!(
                families.contains(&format!("# TYPE {family} ")),
                "the dashboard queries {name}, which the gateway does not have: {e}"
            );
        }
    }
}

fn run_spans<'a>(spans: &'a [Span], run: &str) -> Option<&'a Span> {
    spans
        .iter()
        .find(|s| s.name == "agui.run" && s.attr("run_id").and_then(Value::as_str) == Some(run))
}

/// Every span of the tree under `root`.
fn descendants<'a>(spans: &'a [Span], root: &Span) -> Vec<&'a Span> {
    let mut out: Vec<&Span> = vec![];
    let mut frontier = vec![root.span_id.clone()];
    while let Some(id) = frontier.pop() {
        for s in spans.iter().filter(|s| s.parent_span_id == id) {
            frontier.push(s.span_id.clone());
            out.push(s);
        }
    }
    out
}

/// A run's span tree: the run continues the client's trace (same trace id, the client's span as
/// parent, its `tracestate`), has its attributes, and has admission, state saves and kernel calls
/// below it; the kernel got a `traceparent` of the same trace whose parent is the call's span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_one_span_tree_that_continues_the_clients_trace() {
    let rx = OtlpReceiver::start().await;
    let k = FakeKernel::start().await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"session_id": "s-1"}))
            .text("hello", "m1")
            .completed(),
    );
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();
    let otel = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), rx.endpoint()),
        ("OTEL_SERVICE_NAME".to_owned(), "agui-under-test".to_owned()),
        ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "100".to_owned()),
        (
            "IAC_CODE_AGUI_ALLOWED_CWDS".to_owned(),
            ws_path.display().to_string(),
        ),
    ];
    let gw = gateway(&["--a2a-url", &k.url()], &otel).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let traceparent = format!("00-{trace}-{parent}-01");
    let r = post_turn_as(
        &gw.url(),
        "t1",
        "r1",
        "hi",
        &ws_path.join("a").display().to_string(),
        &[
            ("traceparent", traceparent.as_str()),
            ("tracestate", "vendor=opaque"),
        ],
    )
    .await;
    assert_valid_run(&r, "t1", "r1");
    // A refused request is a span too, with its code.
    let refused = post(&gw.url(), &json!({"threadId": "t1"}), &[]).await;
    assert_eq!(refused.status, 400);
    let spans = rx
        .wait_for(Duration::from_secs(20), |s| {
            run_spans(s, "r1").is_some_and(|run| {
                descendants(s, run)
                    .iter()
                    .any(|c| c.name == "SendStreamingMessage")
            })
        })
        .await;
    let run = run_spans(&spans, "r1").unwrap_or_else(|| panic!("no run span in {spans:#?}"));
    assert_eq!(run.trace_id, trace);
    assert_eq!(run.parent_span_id, parent);
    assert_eq!(run.trace_state, "vendor=opaque");
    assert_eq!(run.kind, 2, "a server span");
    assert_eq!(run.service, "agui-under-test");
    assert_eq!(run.attr("thread_id"), Some(&json!("t1")));
    assert_eq!(run.attr("mode"), Some(&json!("turn")));
    assert_eq!(run.attr("outcome"), Some(&json!("success")));
    assert_eq!(run.attr("event_count"), Some(&json!(r.events.len() as i64)));
    assert!(run
        .attr("execution_id")
        .and_then(Value::as_str)
        .is_some_and(|e| !e.is_empty()));
    assert_eq!(run.attr("error_code"), None);
    let below = descendants(&spans, run);
    let names: Vec<&str> = below.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"agui.admission"), "{names:?}");
    assert!(
        names.iter().filter(|n| **n == "agui.state_save").count() >= 2,
        "{names:?}"
    );
    let call = below
        .iter()
        .find(|s| s.name == "SendStreamingMessage")
        .unwrap();
    assert_eq!(call.kind, 3, "a client span");
    assert_eq!(
        call.attr("rpc.method"),
        Some(&json!("SendStreamingMessage"))
    );
    assert!(below.iter().all(|s| s.trace_id == trace));
    // What the kernel received.
    let sent = k.calls("SendStreamingMessage");
    let tp = sent[0]
        .headers
        .get("traceparent")
        .expect("traceparent sent to the kernel");
    assert_eq!(
        tp,
        &format!("00-{trace}-{}-01", call.span_id),
        "the call's span is the kernel's parent"
    );
    assert_eq!(
        sent[0].headers.get("tracestate").map(String::as_str),
        Some("vendor=opaque")
    );
    let refusal = spans
        .iter()
        .find(|s| s.name == "agui.run" && s.attr("outcome") == Some(&json!("refused")))
        .expect("the refused request's span");
    assert_eq!(refusal.attr("error_code"), Some(&json!("INVALID_INPUT")));
    assert_ne!(
        refusal.trace_id, trace,
        "a request without traceparent starts its own trace"
    );
    gw.stop();

    // Tracing off: the client's headers reach the kernel unchanged (a traced kernel still joins
    // the client's trace), and a malformed one is not passed on.
    let k2 = FakeKernel::start().await;
    k2.stream(
        Stream::of("task-2", &ctx("t2"))
            .task("TASK_STATE_WORKING", json!({}))
            .completed(),
    );
    k2.stream(
        Stream::of("task-3", &ctx("t3"))
            .task("TASK_STATE_WORKING", json!({}))
            .completed(),
    );
    let off = gateway(&["--a2a-url", &k2.url()], &otel[3..]).await;
    let cwd = ws_path.join("b").display().to_string();
    let r = post_turn_as(
        &off.url(),
        "t2",
        "r1",
        "hi",
        &cwd,
        &[("traceparent", traceparent.as_str())],
    )
    .await;
    assert_valid_run(&r, "t2", "r1");
    let r = post_turn_as(
        &off.url(),
        "t3",
        "r1",
        "hi",
        &cwd,
        &[("traceparent", "00-xyz")],
    )
    .await;
    assert_valid_run(&r, "t3", "r1");
    let sent = k2.calls("SendStreamingMessage");
    assert_eq!(sent[0].headers.get("traceparent"), Some(&traceparent));
    assert_eq!(sent[1].headers.get("traceparent"), None);
    off.stop();
    assert_eq!(
        rx.spans().len(),
        spans.len().max(rx.spans().len()),
        "tracing off exports nothing new"
    );
}

/// An OTLP endpoint that refuses, answers slowly or is not there at all never slows or fails a
/// run; what could not be exported is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exporter_in_trouble_never_slows_a_run() {
    let slow = OtlpReceiver::start().await;
    slow.delay(Duration::from_secs(30));
    let refusing = OtlpReceiver::start().await;
    refusing.answer_with(Some(503));
    let nobody = format!("http://127.0.0.1:{}", free_port());
    for (endpoint, reason) in [
        (slow.endpoint(), "queue_full"),
        (refusing.endpoint(), "export_failed"),
        (nobody, "export_failed"),
    ] {
        let k = FakeKernel::start().await;
        let runs = 40;
        for i in 0..runs {
            let c = ctx(&format!("t{i}"));
            k.stream(
                Stream::of(&format!("task-{i}"), &c)
                    .task("TASK_STATE_WORKING", json!({}))
                    .text("hi", "m")
                    .completed(),
            );
        }
        let ws = tempfile::tempdir().unwrap();
        let ws_path = ws.path().canonicalize().unwrap();
        let env = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT".to_owned(), "1000".to_owned()),
            // A queue of 8 spans and quick batches: the trouble shows at once.
            ("OTEL_BSP_MAX_QUEUE_SIZE".to_owned(), "8".to_owned()),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE".to_owned(), "8".to_owned()),
            ("OTEL_BSP_SCHEDULE_DELAY".to_owned(), "50".to_owned()),
            (
                "IAC_CODE_AGUI_ALLOWED_CWDS".to_owned(),
                ws_path.display().to_string(),
            ),
        ];
        let gw = gateway(&["--a2a-url", &k.url()], &env).await;
        let started = Instant::now();
        for i in 0..runs {
            let t = Instant::now();
            let thread = format!("t{i}");
            let r = post_turn(
                &gw.url(),
                &thread,
                "r1",
                "hi",
                &ws_path.join(&thread).display().to_string(),
            )
            .await;
            assert_valid_run(&r, &thread, "r1");
            assert_eq!(r.last()["type"], "RUN_FINISHED", "{}", r.raw);
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "{endpoint}: run {i} took {:?}",
                t.elapsed()
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{endpoint}: {:?}",
            started.elapsed()
        );
        let mut dropped = 0.0;
        let deadline = Instant::now() + Duration::from_secs(15);
        while dropped == 0.0 && Instant::now() < deadline {
            let (_, m) = scrape(&gw.admin()).await;
            dropped = m[&format!("agui_trace_spans_dropped_total{{reason=\"{reason}\"}}")];
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(dropped > 0.0, "{endpoint}: no {reason} drop counted");
        // A stop with the exporter still in trouble is bounded too.
        let t = Instant::now();
        gw.stop();
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{endpoint}: stop took {:?}",
            t.elapsed()
        );
    }
}

/// `--log-format json`: every line is one JSON object with timestamp, level, target and message;
/// lines inside a run carry its thread, run and execution ids as fields; each request has one
/// access line (method, route, status, duration, bytes) and no body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_run_ids_and_one_access_line_per_request() {
    let k = FakeKernel::start().await;
    let c = ctx("j1");
    k.stream(
        Stream::of("task-j", &c)
            .task("TASK_STATE_WORKING", json!({}))
            .text("hello", "m1")
            .then(Item::Cut),
    );
    let ws = tempfile::tempdir().unwrap();
    let ws_path = ws.path().canonicalize().unwrap();
    let env = vec![(
        "IAC_CODE_AGUI_ALLOWED_CWDS".to_owned(),
        ws_path.display().to_string(),
    )];
    let gw = gateway(
        &["--a2a-url", &k.url(), "--log-format", "json", "--debug"],
        &env,
    )
    .await;
    let cwd = ws_path.join("j").display().to_string();
    let r = post_turn(&gw.url(), "j1", "r1", "the request text", &cwd).await;
    assert_valid_run(&r, "j1", "r1");
    assert_eq!(r.last()["code"], "A2A_UNAVAILABLE", "{}", r.raw);
    let h = client()
        .get(format!("{}health", gw.url()))
        .send()
        .await
        .unwrap();
    let health_len = h.bytes().await.unwrap().len();
    // Every route of the gateway is named by its pattern (an unknown path is `other`).
    for path in ["ready", "threads/t9/messages", "nowhere"] {
        let _ = client().get(format!("{}{path}", gw.url())).send().await;
    }
    let log = gw.stop();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    for l in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(l[key].is_string(), "{key} missing: {l}");
        }
    }
    let in_run: Vec<&Value> = lines.iter().filter(|l| l["run_id"] == "r1").collect();
    assert!(
        !in_run.is_empty(),
        "no line of the run carries its id: {log}"
    );
    let failed = in_run
        .iter()
        .find(|l| l["message"] == "kernel stream failed")
        .unwrap_or_else(|| panic!("the stream's failure is logged inside the run: {log}"));
    assert_eq!(failed["thread_id"], "j1");
    assert!(
        failed["execution_id"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{failed}"
    );
    assert_eq!(failed["level"], "WARN");
    assert!(
        failed
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("otel.")),
        "trace-only fields stay out of the logs: {failed}"
    );
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "iac_code_agui::access")
        .collect();
    // The start-up wait polled /health too: one line per request all the same.
    let runs: Vec<&&Value> = access.iter().filter(|a| a["route"] == "/").collect();
    assert_eq!(runs.len(), 1, "{access:?}");
    assert_eq!(runs[0]["method"], "POST");
    assert_eq!(runs[0]["status"], 200);
    assert_eq!(runs[0]["bytes"], r.raw.len() as u64);
    assert_eq!(runs[0]["complete"], true);
    let named: Vec<&Value> = access[access.len() - 3..]
        .iter()
        .map(|a| &a["route"])
        .collect();
    assert_eq!(
        named,
        [
            &json!("/ready"),
            &json!("/threads/{thread_id}/messages"),
            &json!("other")
        ]
    );
    let health = access[access.len() - 4];
    assert_eq!(
        (&health["route"], &health["method"]),
        (&json!("/health"), &json!("GET"))
    );
    assert_eq!(health["bytes"], health_len as u64);
    assert!(access
        .iter()
        .all(|a| a["duration_ms"].as_f64().is_some_and(|d| d >= 0.0)));
    assert!(!log.contains("the request text"), "no body in the logs");
}
