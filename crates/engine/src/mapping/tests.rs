use super::*;
use serde_json::json;

fn mapper() -> Mapper {
    let mut n = 0;
    Mapper::with_idgen(
        "r1",
        BTreeSet::new(),
        "t1",
        Box::new(move || {
            n += 1;
            format!("{n:032x}")
        }),
    )
}

fn status(state: &str, meta: Value) -> Value {
    json!({"taskId":"task-1","contextId":"C","status":{"state":state},"metadata":{"iac_code":meta}})
}

fn text(t: &str, id: &str, meta: Value) -> Value {
    json!({"taskId":"task-1","contextId":"C","status":{"state":"TASK_STATE_WORKING",
        "message":{"role":"ROLE_AGENT","parts":[{"text":t}],"messageId":id}},"metadata":{"iac_code":meta}})
}

fn types(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            Event::Custom { name, .. } => format!("CUSTOM({name})"),
            Event::StepStarted { step_name } => format!("STEP_STARTED({step_name})"),
            Event::StepFinished { step_name } => format!("STEP_FINISHED({step_name})"),
            other => other.type_name().to_owned(),
        })
        .collect()
}

/// Spans must balance: every START has its END, nothing is closed that was not open.
pub(crate) fn assert_balanced(events: &[Event]) {
    let mut open: BTreeSet<String> = BTreeSet::new();
    for e in events {
        let (k, opening) = match e {
            Event::TextMessageStart { message_id } => (format!("text:{message_id}"), Some(true)),
            Event::TextMessageContent { message_id, .. } => {
                assert!(
                    open.contains(&format!("text:{message_id}")),
                    "content of closed {message_id}"
                );
                continue;
            }
            Event::TextMessageEnd { message_id } => (format!("text:{message_id}"), Some(false)),
            Event::ToolCallStart { tool_call_id, .. } => {
                (format!("tool:{tool_call_id}"), Some(true))
            }
            Event::ToolCallArgs { tool_call_id, .. } => {
                assert!(open.contains(&format!("tool:{tool_call_id}")));
                continue;
            }
            Event::ToolCallEnd { tool_call_id } => (format!("tool:{tool_call_id}"), Some(false)),
            Event::ReasoningStart { message_id } => (format!("rs:{message_id}"), Some(true)),
            Event::ReasoningEnd { message_id } => (format!("rs:{message_id}"), Some(false)),
            Event::ReasoningMessageStart { message_id } => (format!("rm:{message_id}"), Some(true)),
            Event::ReasoningMessageEnd { message_id } => (format!("rm:{message_id}"), Some(false)),
            Event::StepStarted { step_name } => (format!("step:{step_name}"), Some(true)),
            Event::StepFinished { step_name } => (format!("step:{step_name}"), Some(false)),
            _ => continue,
        };
        match opening {
            Some(true) => assert!(open.insert(k.clone()), "{k} opened twice"),
            Some(false) => assert!(open.remove(&k), "{k} closed but not open"),
            None => {}
        }
    }
    assert!(open.is_empty(), "left open: {open:?}");
}

#[test]
fn full_normal_turn_mapping_j1() {
    let mut m = mapper();
    let mut out = Vec::new();
    let items = vec![
        json!({"id":"task-1","contextId":"C","status":{"state":"TASK_STATE_SUBMITTED"},"metadata":{"iac_code":{"iacCodeSessionId":"sess-1"}}}),
        status(
            "TASK_STATE_WORKING",
            json!({"thinking":{"type":"raw_thinking","text":"hmm"}}),
        ),
        text("Hello ", "msg-a", json!({})),
        text("world", "msg-a", json!({})),
        status(
            "TASK_STATE_WORKING",
            json!({"tool":{"status":"started","toolUseId":"tu1","name":"read"}}),
        ),
        status(
            "TASK_STATE_WORKING",
            json!({"tool":{"status":"input_complete","toolUseId":"tu1","name":"read","toolInput":{"path":"a","b":1}}}),
        ),
        status(
            "TASK_STATE_WORKING",
            json!({"tool":{"status":"progress","toolUseId":"tu1","mcp":{"progress":1.0}}}),
        ),
        status(
            "TASK_STATE_WORKING",
            json!({"tool":{"status":"completed","toolUseId":"tu1","result":{"ok":true}}}),
        ),
        status(
            "TASK_STATE_WORKING",
            json!({"usage":{"provider":"p","model":"m","inputTokens":10.0,"outputTokens":5.0,"totalTokens":15.0}}),
        ),
        status(
            "TASK_STATE_WORKING",
            json!({"usage":{"provider":"p","model":"m","inputTokens":1.0,"outputTokens":1.0,"totalTokens":2.0,"cachedInputTokens":3.0}}),
        ),
        json!({"taskId":"task-1","contextId":"C","artifact":{"artifactId":"a1","name":"f.txt"}}),
        json!({"taskId":"task-1","contextId":"C","status":{"state":"TASK_STATE_COMPLETED",
            "message":{"role":"ROLE_AGENT","parts":[{"text":"done"}],"messageId":"msg-final"}},
            "metadata":{"iac_code":{"assistantFinal":{"complete":true}}}}),
    ];
    for it in &items {
        m.map_item(it, &mut out);
    }
    m.close_all(&mut out);
    assert_eq!(
        types(&out),
        vec![
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
            "CUSTOM(iac-code.tool-progress.v1)",
            "TOOL_CALL_RESULT",
            "CUSTOM(iac-code.artifact.v1)",
            "TEXT_MESSAGE_END",
        ]
    );
    assert_balanced(&out);
    assert_eq!(
        out[0],
        Event::ReasoningStart {
            message_id: "reasoning-r1".into()
        }
    );
    assert_eq!(
        out[8],
        Event::ToolCallStart {
            tool_call_id: "tu1".into(),
            tool_call_name: "read".into(),
            parent_message_id: Some("msg-a".into())
        }
    );
    assert_eq!(
        out[9],
        Event::ToolCallArgs {
            tool_call_id: "tu1".into(),
            delta: r#"{"b":1,"path":"a"}"#.into()
        }
    );
    assert_eq!(
        out[12],
        Event::ToolCallResult {
            message_id: "tool-result-tu1".into(),
            tool_call_id: "tu1".into(),
            content: r#"{"ok":true}"#.into()
        }
    );
    let usage = m.usage().unwrap();
    assert_eq!(usage.len(), 1);
    assert_eq!(
        (
            usage[0].input_tokens,
            usage[0].output_tokens,
            usage[0].total_tokens,
            usage[0].cached_input_tokens
        ),
        (11, 6, 17, 3)
    );
}

#[test]
fn text_without_id_history_fallback_and_message_switch() {
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_item(
        &json!({"status":{"state":"TASK_STATE_COMPLETED","message":{"role":"ROLE_AGENT","parts":[{"text":"final only"}]}}}),
        &mut out,
    );
    assert_eq!(
        out[0],
        Event::TextMessageStart {
            message_id: format!("assistant-{:032x}", 1)
        }
    );
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_item(
        &json!({"status":{"state":"TASK_STATE_COMPLETED"},"history":[
            {"role":"ROLE_USER","parts":[{"text":"q"}],"messageId":"u"},
            {"role":"ROLE_AGENT","parts":[{"text":"A"}],"messageId":"h1"},
            {"role":"ROLE_AGENT","parts":[{"text":"B"}],"messageId":"h2"}]}),
        &mut out,
    );
    assert_eq!(
        out[1],
        Event::TextMessageContent {
            message_id: "h2".into(),
            delta: "AB".into()
        }
    );
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_item(&text("a", "m1", json!({})), &mut out);
    m.map_item(&text("b", "m2", json!({})), &mut out);
    m.close_all(&mut out);
    assert_eq!(
        types(&out),
        [
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END"
        ]
    );
}

#[test]
fn tool_edge_cases() {
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_item(
        &status(
            "W",
            json!({"tool":{"status":"started","toolUseId":"tu2","name":"bash"}}),
        ),
        &mut out,
    );
    m.map_item(
        &status(
            "W",
            json!({"tool":{"status":"completed","toolUseId":"tu2","result":"ok"}}),
        ),
        &mut out,
    );
    m.map_item(
        &status(
            "W",
            json!({"tool":{"status":"completed","toolUseId":"tu2","result":"ok"}}),
        ),
        &mut out,
    );
    m.map_item(&status("W", json!({"tool":{"status":"input_complete","toolUseId":"tu3","name":"ls","inputSummary":"ls -la"}})), &mut out);
    m.close_all(&mut out);
    assert_eq!(
        types(&out),
        [
            "TOOL_CALL_START",
            "TOOL_CALL_RESULT",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_END"
        ]
    );
    assert_eq!(
        out[3],
        Event::ToolCallArgs {
            tool_call_id: "tu3".into(),
            delta: r#"{"summary":"ls -la"}"#.into()
        }
    );
    assert_balanced(&out);
}

#[test]
fn negative_or_fractional_usage_is_dropped_not_fatal() {
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_item(
        &status(
            "W",
            json!({"usage":{"inputTokens":-1.0,"outputTokens":2.5,"totalTokens":3.0,"model":"m"}}),
        ),
        &mut out,
    );
    let u = m.usage().unwrap();
    assert_eq!(
        (u[0].input_tokens, u[0].output_tokens, u[0].total_tokens),
        (0, 0, 3)
    );
    assert_eq!(u[0].provider, None);
}

fn env(seq: u64, event_type: &str, extra: Value) -> Value {
    let mut e = json!({"schemaVersion":"1.0","eventId":format!("e{seq}"),"sequence":seq as f64,"eventType":event_type,"scope":"pipeline"});
    for (k, v) in extra.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

#[test]
fn pipeline_batch_mapping_and_dedupe_k1() {
    let mut m = mapper();
    let mut out = Vec::new();
    let e3 = env(
        3,
        "text_delta",
        json!({"scope":"candidate","candidate":{"runId":"c1run"},"candidateStep":{"id":"gen"},"data":{"text":"cand text"}}),
    );
    let mut stale = env(2, "stack_progress", json!({"data":{}}));
    stale["eventId"] = json!("e-other");
    let batch = json!({"status":{"state":"TASK_STATE_WORKING"},"metadata":{"iac_code":{"pipelineBatch":{"events":[
        env(1, "pipeline_started", json!({"data":{}})),
        env(2, "candidate_step_started", json!({"candidate":{"id":"c1"},"candidateStep":{"id":"gen"},"data":{}})),
        e3.clone(),
        e3,
        stale,
        env(4, "thinking_delta", json!({"data":{"type":"raw_thinking","text":"t"}})),
        env(5, "tool_started", json!({"data":{"toolUseId":"pt1","toolName":"x","input":{"z":1,"a":"é"}}})),
        env(6, "tool_result", json!({"data":{"toolUseId":"pt1","isError":true,"result":{"err":"bad"}}})),
        env(7, "usage", json!({"data":{"inputTokens":3.0,"model":"m"}})),
        env(8, "step_completed", json!({"step":{"id":"never"},"data":{}})),
        env(9, "stack_progress", json!({"data":{}})),
        env(10, "foo", json!({"data":{}})),
    ]}}}});
    m.map_item(&batch, &mut out);
    assert_eq!(
        types(&out),
        [
            "CUSTOM(iac-code.pipeline.v1)",
            "STEP_STARTED(candidate:c1:gen)",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "REASONING_START",
            "REASONING_MESSAGE_START",
            "REASONING_MESSAGE_CONTENT",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_RESULT",
            "CUSTOM(iac-code.pipeline.v1)",
        ]
    );
    assert_eq!(
        out[2],
        Event::TextMessageStart {
            message_id: "pipeline-message:pipeline-t1:candidate:c1run:gen".into()
        }
    );
    assert_eq!(
        out[4],
        Event::ReasoningStart {
            message_id: "reasoning-pipeline-message:pipeline-t1:pipeline".into()
        }
    );
    assert_eq!(
        out[8],
        Event::ToolCallArgs {
            tool_call_id: "pt1".into(),
            delta: r#"{"a":"é","z":1}"#.into()
        }
    );
    assert_eq!(
        out[10],
        Event::ToolCallResult {
            message_id: "tool-result-pt1".into(),
            tool_call_id: "pt1".into(),
            content: r#"{"err":"bad"}"#.into()
        }
    );
    if let Event::Custom { value, .. } = &out[11] {
        assert_eq!(value["eventId"], "e9");
    }
    assert_eq!(m.pipeline_sequence(), 10);
    assert_eq!(m.usage().unwrap()[0].input_tokens, 3);
    m.close_all(&mut out);
    assert_balanced(&out);
}

#[test]
fn allow_list_and_steps() {
    for t in ALLOW_LIST {
        let mut m = mapper();
        let mut out = Vec::new();
        m.map_envelope(&env(1, t, json!({"data":{}})), &mut out);
        assert_eq!(types(&out), ["CUSTOM(iac-code.pipeline.v1)"], "{t}");
    }
    assert_eq!(ALLOW_LIST.len(), 34);
    for t in [
        "text_delta",
        "thinking_delta",
        "tool_started",
        "tool_result",
        "usage",
        "step_started",
        "step_completed",
        "candidate_step_started",
        "candidate_step_completed",
        "input_received",
        "foo",
    ] {
        let mut m = mapper();
        let mut out = Vec::new();
        m.map_envelope(&env(1, t, json!({})), &mut out);
        assert!(!types(&out).iter().any(|x| x.starts_with("CUSTOM")), "{t}");
    }
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_envelope(
        &env(1, "step_started", json!({"step":{"id":"s1"}})),
        &mut out,
    );
    m.map_envelope(
        &env(2, "step_failed", json!({"step":{"id":"s1"}})),
        &mut out,
    );
    assert_eq!(
        types(&out),
        [
            "STEP_STARTED(s1)",
            "STEP_FINISHED(s1)",
            "CUSTOM(iac-code.pipeline.v1)"
        ]
    );
    // A step still open at run end is closed but stays durable.
    let mut m = mapper();
    let mut out = Vec::new();
    m.map_envelope(
        &env(1, "step_started", json!({"step":{"id":"s2"}})),
        &mut out,
    );
    m.close_all(&mut out);
    assert_eq!(types(&out), ["STEP_STARTED(s2)", "STEP_FINISHED(s2)"]);
    assert!(m.durable_open_steps().contains("step:s2"));
    // Closed without an open span in this run: a zero-length pair.
    let mut m = mapper();
    m.set_pipeline_state(["step:s3".to_owned()].into(), 0);
    let mut out = Vec::new();
    m.map_envelope(
        &env(1, "step_completed", json!({"step":{"id":"s3"}})),
        &mut out,
    );
    assert_eq!(types(&out), ["STEP_STARTED(s3)", "STEP_FINISHED(s3)"]);
}

#[test]
fn parallel_pipeline_messages_stay_open() {
    let mut m = mapper();
    let mut out = Vec::new();
    let a = json!({"candidate":{"runId":"A"},"scope":"candidate","data":{"text":"a"}});
    let b = json!({"candidate":{"runId":"B"},"scope":"candidate","data":{"text":"b"}});
    m.map_envelope(&env(1, "text_delta", a.clone()), &mut out);
    m.map_envelope(&env(2, "text_delta", b), &mut out);
    m.map_envelope(&env(3, "text_delta", a), &mut out);
    m.close_all(&mut out);
    assert_eq!(
        types(&out),
        [
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_CONTENT",
            "TEXT_MESSAGE_END",
            "TEXT_MESSAGE_END"
        ]
    );
    assert_balanced(&out);
}

#[test]
fn replayed_prefix_is_trimmed_after_resume() {
    let digest = sha256_hex("Let me run");
    let mut m = Mapper::new("r2", [digest].into(), "t1");
    let mut out = Vec::new();
    m.map_item(&text("Let me run. Done", "m-a", json!({})), &mut out);
    assert_eq!(
        out[1],
        Event::TextMessageContent {
            message_id: "m-a".into(),
            delta: ". Done".into()
        }
    );
}

#[test]
fn the_longest_recorded_prefix_is_trimmed_at_character_boundaries() {
    // Digests of a shorter and a longer prefix (the longer wins), one ending inside no character.
    let text = "héllo wörld, and more";
    let mut m = Mapper::new(
        "r2",
        [
            sha256_hex("hé"),
            sha256_hex("héllo wö"),
            sha256_hex("nothing"),
        ]
        .into(),
        "t1",
    );
    let mut out = Vec::new();
    m.map_item(&text_item(text), &mut out);
    assert_eq!(
        out[1],
        Event::TextMessageContent {
            message_id: "m-a".into(),
            delta: "rld, and more".into()
        }
    );
    // The whole text recorded: nothing is shown again.
    let mut m = Mapper::new("r2", [sha256_hex(text)].into(), "t1");
    let mut out = Vec::new();
    m.map_item(&text_item(text), &mut out);
    assert!(out.is_empty(), "{out:?}");
}

#[test]
fn trimming_a_long_first_text_is_linear() {
    // 150,000 characters: hashing every prefix afresh is about 10^10 bytes (several seconds); one
    // running hash is well under a second even in a debug build.
    let long = "x".repeat(150_000);
    let mut m = Mapper::new("r2", [sha256_hex(&long[..100_000])].into(), "t1");
    let mut out = Vec::new();
    let started = std::time::Instant::now();
    m.map_item(&text_item(&long), &mut out);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        out[1],
        Event::TextMessageContent {
            message_id: "m-a".into(),
            delta: "x".repeat(50_000)
        }
    );
}

fn text_item(t: &str) -> Value {
    text(t, "m-a", json!({}))
}

#[test]
fn session_id_sources() {
    let m = json!({"pipelineBatch":{"events":[{"x":1},{"iacCodeSessionId":"S2"}]}});
    assert_eq!(session_id(m.as_object().unwrap()), Some("S2"));
    let m = json!({"iacCodeSessionId":"S1","pipeline":{"iacCodeSessionId":"S3"}});
    assert_eq!(session_id(m.as_object().unwrap()), Some("S1"));
}

mod fast_path {
    use super::*;
    use crate::mapping::fast::{text_delta, Known, TextDelta};
    use proptest::prelude::*;

    const KNOWN: Known<'static> = Known {
        task_id: "task-1",
        context_id: "C",
        session_id: Some("sess-1"),
    };

    /// A text delta frame as the real kernel writes it.
    fn frame(text: &str, message_id: &str) -> Value {
        json!({"result": {"statusUpdate": {"taskId": "task-1", "contextId": "C",
            "status": {"state": "TASK_STATE_WORKING", "message": {"messageId": message_id, "contextId": "C",
                "taskId": "task-1", "role": "ROLE_AGENT", "parts": [{"text": text}]}, "timestamp": "2026-11-29T23:14:29.627814Z"},
            "metadata": {"iac_code": {"iacCodeSessionId": "sess-1"}}}}, "id": "rpc-1", "jsonrpc": "2.0"})
    }

    fn fast(v: &Value) -> Option<TextDelta> {
        text_delta(serde_json::to_string(v).unwrap().as_bytes(), KNOWN)
    }

    #[test]
    fn the_kernel_text_frame_is_fast_with_escapes_and_several_parts() {
        let d = fast(&frame("tick \"1\"\n é 🚀", "task-1-message")).unwrap();
        assert_eq!(d.text, "tick \"1\"\n é 🚀");
        assert_eq!(d.message_id, "task-1-message");
        let mut v = frame("a", "m");
        v["result"]["statusUpdate"]["status"]["message"]["parts"] =
            json!([{"text": "a"}, {"text": "b"}]);
        assert_eq!(fast(&v).unwrap().text, "ab");
        // Without metadata, or with a null session, too.
        let mut v = frame("a", "m");
        v["result"]["statusUpdate"]
            .as_object_mut()
            .unwrap()
            .remove("metadata");
        assert!(fast(&v).is_some());
    }

    #[test]
    fn anything_else_takes_the_generic_path() {
        type Edit = Box<dyn Fn(&mut Value)>;
        let edits: Vec<(&str, Edit)> = vec![
            (
                "extra top-level key",
                Box::new(|v| v["error"] = json!(null)),
            ),
            (
                "no id",
                Box::new(|v| {
                    v.as_object_mut().unwrap().remove("id");
                }),
            ),
            (
                "extra result key",
                Box::new(|v| v["result"]["task"] = json!({})),
            ),
            (
                "extra update key",
                Box::new(|v| v["result"]["statusUpdate"]["final"] = json!(false)),
            ),
            (
                "other task",
                Box::new(|v| v["result"]["statusUpdate"]["taskId"] = json!("task-2")),
            ),
            (
                "other context",
                Box::new(|v| v["result"]["statusUpdate"]["contextId"] = json!("D")),
            ),
            (
                "other state",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["status"]["state"] =
                        json!("TASK_STATE_INPUT_REQUIRED")
                }),
            ),
            (
                "lower-case state",
                Box::new(|v| v["result"]["statusUpdate"]["status"]["state"] = json!("working")),
            ),
            (
                "extra status key",
                Box::new(|v| v["result"]["statusUpdate"]["status"]["x"] = json!(1)),
            ),
            (
                "user role",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["status"]["message"]["role"] = json!("ROLE_USER")
                }),
            ),
            (
                "data part",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["status"]["message"]["parts"] =
                        json!([{"data": {}}])
                }),
            ),
            (
                "no parts",
                Box::new(|v| v["result"]["statusUpdate"]["status"]["message"]["parts"] = json!([])),
            ),
            (
                "empty text",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["status"]["message"]["parts"] =
                        json!([{"text": ""}])
                }),
            ),
            (
                "empty message id",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["status"]["message"]["messageId"] = json!("")
                }),
            ),
            (
                "message metadata",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["status"]["message"]["metadata"] = json!({})
                }),
            ),
            (
                "other session",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["metadata"]["iac_code"]["iacCodeSessionId"] =
                        json!("sess-2")
                }),
            ),
            (
                "more metadata",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["metadata"]["iac_code"]["usage"] = json!({})
                }),
            ),
            (
                "assistant final",
                Box::new(|v| {
                    v["result"]["statusUpdate"]["metadata"]["iac_code"]["assistantFinal"] =
                        json!({"complete": true})
                }),
            ),
            (
                "other metadata namespace",
                Box::new(|v| v["result"]["statusUpdate"]["metadata"]["x"] = json!({})),
            ),
        ];
        for (what, edit) in edits {
            let mut v = frame("hello", "m1");
            edit(&mut v);
            assert!(fast(&v).is_none(), "{what}");
        }
        assert!(text_delta(b"{not json", KNOWN).is_none());
        // A session the run does not know yet is recorded by the generic path.
        let unknown_session = Known {
            session_id: None,
            ..KNOWN
        };
        let v = serde_json::to_string(&frame("a", "m")).unwrap();
        assert!(text_delta(v.as_bytes(), unknown_session).is_none());
    }

    proptest! {
        /// The fast path (with the continuation shortcut) and the generic path emit the same events
        /// and record the same text for any sequence of deltas.
        #[test]
        fn fast_and_generic_paths_emit_the_same_events(
            deltas in prop::collection::vec(("\\PC{1,12}", 0usize..3), 1..12),
        ) {
            let mut generic = mapper();
            let mut quick = mapper();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for (text, msg) in &deltas {
                let id = format!("task-1-m{msg}");
                let v = frame(text, &id);
                let d = fast(&v).expect("a fast frame");
                let item = a2a::ItemView::new(&v["result"]).obj.clone();
                generic.map_item(&item, &mut a);
                // As the driver does: a continuation is encoded straight from the frame.
                if let Some(sent) = quick.continue_text(&d.message_id, &d.text) {
                    b.push(Event::TextMessageContent { message_id: sent.to_owned(), delta: d.text });
                } else {
                    quick.status_text(Some(d.message_id), &d.text, false, &mut b);
                }
            }
            generic.close_all(&mut a);
            quick.close_all(&mut b);
            // The text recorded for resume trimming is the same too.
            prop_assert_eq!(generic.text_digests(), quick.text_digests());
            let enc = |e: &Vec<Event>| {
                e.iter()
                    .map(|x| {
                        let mut out = Vec::new();
                        x.encode_json(0, &mut out);
                        out
                    })
                    .collect::<Vec<_>>()
            };
            prop_assert_eq!(enc(&a), enc(&b));
        }
    }
}

/// The ids a run's events carry, in order: `START:<id>`, `CONTENT:<id>`, `END:<id>`, the tool
/// call's parent, the reasoning's start.
fn span_ids(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::TextMessageStart { message_id } => Some(format!("START:{message_id}")),
            Event::TextMessageContent { message_id, .. } => Some(format!("CONTENT:{message_id}")),
            Event::TextMessageEnd { message_id } => Some(format!("END:{message_id}")),
            Event::ToolCallStart {
                parent_message_id, ..
            } => Some(format!(
                "TOOL:{}",
                parent_message_id.as_deref().unwrap_or("-")
            )),
            Event::ReasoningStart { message_id } => Some(format!("REASONING:{message_id}")),
            Event::ReasoningMessageContent { message_id, .. } => {
                Some(format!("THINK:{message_id}"))
            }
            _ => None,
        })
        .collect()
}

/// A text message the kernel names again after an interrupt's resume (its task's one text id)
/// is a new message: the resumed run's mapper, given the ids the execution used, starts it
/// under `<id>-2`, its tool calls' parent and its deltas (the fast path's too) under that id;
/// a third run under `<id>-3`. The same document gives the same ids (a replay sees them).
#[test]
fn a_text_message_named_again_after_a_resume_gets_an_id_of_its_own() {
    let mut first = mapper();
    let mut out = Vec::new();
    first.map_item(&text("Let me run", "task-1-message", json!({})), &mut out);
    first.map_item(
        &status(
            "TASK_STATE_WORKING",
            json!({"tool":{"status":"started","toolUseId":"tu1","name":"bash"}}),
        ),
        &mut out,
    );
    first.close_all(&mut out);
    assert_eq!(
        span_ids(&out),
        [
            "START:task-1-message",
            "CONTENT:task-1-message",
            "TOOL:task-1-message",
            "END:task-1-message"
        ]
    );
    let used = first.message_ids().clone();
    assert_eq!(used, BTreeSet::from(["task-1-message".to_owned()]));

    let resumed = |used: &BTreeSet<String>| {
        let mut m = mapper();
        m.restore(
            first.text_digests().clone(),
            used.clone(),
            BTreeSet::new(),
            0,
        );
        m
    };
    let mut second = resumed(&used);
    let mut out = Vec::new();
    second.map_item(&text("Done.", "task-1-message", json!({})), &mut out);
    // A delta of the fast path continues the message under the id it was sent under.
    assert_eq!(
        second.continue_text("task-1-message", " Really."),
        Some("task-1-message-2")
    );
    second.close_all(&mut out);
    assert_eq!(
        span_ids(&out),
        [
            "START:task-1-message-2",
            "CONTENT:task-1-message-2",
            "END:task-1-message-2"
        ]
    );
    assert_balanced(&out);
    // Again from the same document: the same ids.
    let mut again = resumed(&used);
    let mut out2 = Vec::new();
    again.map_item(&text("Done.", "task-1-message", json!({})), &mut out2);
    again.close_all(&mut out2);
    assert_eq!(span_ids(&out2)[0], "START:task-1-message-2");
    // A third run of the execution.
    let mut third = resumed(second.message_ids());
    let mut out = Vec::new();
    third.map_item(&text("And now.", "task-1-message", json!({})), &mut out);
    third.close_all(&mut out);
    assert_eq!(span_ids(&out)[0], "START:task-1-message-3");
}

/// Within one run, a message closed and named again (status text switching between ids), and a
/// reasoning opened again under the same text message, start under new ids; every span still
/// balances.
#[test]
fn a_span_opened_again_in_one_run_gets_a_new_id() {
    let mut m = mapper();
    let mut out = Vec::new();
    let think = |t: &str| {
        status(
            "TASK_STATE_WORKING",
            json!({"thinking":{"type":"raw_thinking","text":t}}),
        )
    };
    m.map_item(&text("a", "A", json!({})), &mut out);
    m.map_item(&think("first"), &mut out);
    m.map_item(&text("b", "A", json!({})), &mut out);
    m.map_item(&think("second"), &mut out);
    m.map_item(&text("c", "B", json!({})), &mut out);
    m.map_item(&text("d", "A", json!({})), &mut out);
    m.close_all(&mut out);
    assert_balanced(&out);
    let ids = span_ids(&out);
    assert_eq!(
        ids,
        [
            "START:A",
            "CONTENT:A",
            "REASONING:reasoning-A",
            "THINK:reasoning-A",
            "CONTENT:A",
            "REASONING:reasoning-A-2",
            "THINK:reasoning-A-2",
            "END:A",
            "START:B",
            "CONTENT:B",
            "END:B",
            "START:A-2",
            "CONTENT:A-2",
            "END:A-2",
        ]
    );
}
