//! An AG-UI SSE client for tests: posts a RunAgentInput and collects events, heartbeats and the
//! raw bytes; plus the stream invariants every run must satisfy.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

/// The outcome of one POST.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub status: u16,
    pub content_type: String,
    pub headers: Vec<(String, String)>,
    /// The JSON body of a non-SSE answer.
    pub json: Option<Value>,
    pub events: Vec<Value>,
    pub heartbeats: usize,
    pub raw: String,
}

impl RunResult {
    pub fn types(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|e| {
                let t = e["type"].as_str().unwrap_or("?").to_owned();
                match t.as_str() {
                    "CUSTOM" => format!("CUSTOM({})", e["name"].as_str().unwrap_or("")),
                    "STEP_STARTED" | "STEP_FINISHED" => {
                        format!("{t}({})", e["stepName"].as_str().unwrap_or(""))
                    }
                    _ => t,
                }
            })
            .collect()
    }
    /// Events of one type.
    pub fn of(&self, t: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["type"] == t).collect()
    }
    /// The text of the run's messages: every `TEXT_MESSAGE_CONTENT` delta, in order.
    pub fn text(&self) -> String {
        self.of("TEXT_MESSAGE_CONTENT")
            .iter()
            .map(|e| e["delta"].as_str().expect("a text delta"))
            .collect()
    }
    /// The execution id the run's first session event names.
    pub fn execution_id(&self) -> String {
        self.sessions()[0]["executionId"]
            .as_str()
            .expect("an execution id")
            .to_owned()
    }
    pub fn last(&self) -> &Value {
        self.events.last().expect("at least one event")
    }
    pub fn error_code(&self) -> Option<&str> {
        self.json.as_ref().and_then(|j| j["error"]["code"].as_str())
    }
    pub fn error_message(&self) -> Option<&str> {
        self.json
            .as_ref()
            .and_then(|j| j["error"]["message"].as_str())
    }
    /// The `iac-code.session.v1` values.
    pub fn sessions(&self) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["type"] == "CUSTOM" && e["name"] == "iac-code.session.v1")
            .map(|e| &e["value"])
            .collect()
    }
}

/// Parses SSE bytes into events and heartbeat count (LF framing only, as AG-UI clients do).
pub fn parse(raw: &str) -> (Vec<Value>, usize) {
    let mut events = Vec::new();
    let mut heartbeats = 0;
    for block in raw.split("\n\n") {
        if block.is_empty() {
            continue;
        }
        if block == ": heartbeat" {
            heartbeats += 1;
            continue;
        }
        let data: Vec<&str> = block
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .collect();
        if data.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&data.join("\n"))
            .unwrap_or_else(|e| panic!("bad event {block:?}: {e}"));
        events.push(v);
    }
    (events, heartbeats)
}

/// The `id:` of every event block (`None` for an event without one), in order.
pub fn event_ids(raw: &str) -> Vec<Option<u64>> {
    raw.split("\n\n")
        .filter(|b| b.lines().any(|l| l.starts_with("data:")))
        .map(|b| {
            b.lines()
                .find_map(|l| l.strip_prefix("id: ").or_else(|| l.strip_prefix("id:")))
                .and_then(|v| v.trim().parse().ok())
        })
        .collect()
}

/// Posts `body` to `url` and reads the whole answer.
pub async fn post(url: &str, body: &Value, headers: &[(&str, &str)]) -> RunResult {
    post_raw(
        url,
        body.to_string().into_bytes(),
        "application/json",
        headers,
    )
    .await
}

pub async fn post_raw(
    url: &str,
    body: Vec<u8>,
    content_type: &str,
    headers: &[(&str, &str)],
) -> RunResult {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let mut rb = client
        .post(url)
        .header("content-type", content_type)
        .header("accept", "text/event-stream")
        .body(body)
        .timeout(Duration::from_secs(180));
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let resp = rb.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let hdrs: Vec<(String, String)> = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let raw = resp.text().await.expect("body read");
    if content_type.starts_with("text/event-stream") {
        let (events, heartbeats) = parse(&raw);
        RunResult {
            status,
            content_type,
            headers: hdrs,
            json: None,
            events,
            heartbeats,
            raw,
        }
    } else {
        RunResult {
            status,
            content_type,
            headers: hdrs,
            json: serde_json::from_str(&raw).ok(),
            events: vec![],
            heartbeats: 0,
            raw,
        }
    }
}

/// Every stream that started ends with exactly one terminal event, ids match the request, and
/// spans are balanced (the checks `@ag-ui/client` does not do, plus the ones it does).
pub fn assert_valid_run(r: &RunResult, thread_id: &str, run_id: &str) {
    assert_eq!(r.status, 200, "{}", r.raw);
    let ev = &r.events;
    assert!(!ev.is_empty(), "no events");
    // Every event carries its id: 1, 2, 3, … within the run.
    let ids = event_ids(&r.raw);
    let want: Vec<Option<u64>> = (1..=ev.len() as u64).map(Some).collect();
    assert_eq!(ids, want, "event ids: {}", r.raw);
    assert_eq!(ev[0]["type"], "RUN_STARTED", "{}", r.raw);
    assert_eq!(ev[0]["threadId"], thread_id);
    assert_eq!(ev[0]["runId"], run_id);
    let terminals: Vec<usize> = ev
        .iter()
        .enumerate()
        .filter(|(_, e)| e["type"] == "RUN_FINISHED" || e["type"] == "RUN_ERROR")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        terminals,
        vec![ev.len() - 1],
        "exactly one terminal event, last: {}",
        r.raw
    );
    let last = &ev[ev.len() - 1];
    if last["type"] == "RUN_FINISHED" {
        assert_eq!(last["threadId"], thread_id);
        assert_eq!(last["runId"], run_id);
    } else {
        // RUN_ERROR carries no ids (AG-UI shape; clients strip extra fields with a warning).
        assert!(last.get("threadId").is_none() && last.get("runId").is_none());
    }
    let mut open: BTreeSet<String> = BTreeSet::new();
    for e in ev {
        assert!(e["timestamp"].is_i64(), "integer timestamp: {e}");
        let t = e["type"].as_str().unwrap_or("");
        let key = |kind: &str, f: &str| format!("{kind}:{}", e[f].as_str().unwrap_or(""));
        let (k, opening) = match t {
            "TEXT_MESSAGE_START" => (key("text", "messageId"), true),
            "TEXT_MESSAGE_END" => (key("text", "messageId"), false),
            "TOOL_CALL_START" => (key("tool", "toolCallId"), true),
            "TOOL_CALL_END" => (key("tool", "toolCallId"), false),
            "REASONING_START" => (key("rs", "messageId"), true),
            "REASONING_END" => (key("rs", "messageId"), false),
            "REASONING_MESSAGE_START" => (key("rm", "messageId"), true),
            "REASONING_MESSAGE_END" => (key("rm", "messageId"), false),
            "STEP_STARTED" => (key("step", "stepName"), true),
            "STEP_FINISHED" => (key("step", "stepName"), false),
            "TEXT_MESSAGE_CONTENT" => {
                assert!(
                    open.contains(&key("text", "messageId")),
                    "content of a closed message: {e}"
                );
                continue;
            }
            "TOOL_CALL_ARGS" => {
                assert!(
                    open.contains(&key("tool", "toolCallId")),
                    "args of a closed call: {e}"
                );
                continue;
            }
            "REASONING_MESSAGE_CONTENT" => {
                assert!(
                    open.contains(&key("rm", "messageId")),
                    "content of closed reasoning: {e}"
                );
                continue;
            }
            _ => continue,
        };
        if opening {
            assert!(open.insert(k.clone()), "{k} opened twice");
        } else {
            assert!(open.remove(&k), "{k} closed but not open");
        }
    }
    assert!(open.is_empty(), "spans left open: {open:?}\n{}", r.raw);
}
