use super::*;
use crate::validate::envelope::ResumeStatus;

fn run(events: &[Event]) -> Vec<Value> {
    let mut r = Recorder::new("run-1");
    for e in events {
        r.event(e);
    }
    r.take()
}

#[test]
fn text_tool_call_and_result_fold_as_a_client_folds_them() {
    let got = run(&[
        Event::TextMessageStart {
            message_id: "m1".into(),
        },
        Event::TextMessageContent {
            message_id: "m1".into(),
            delta: "Hel".into(),
        },
        Event::TextMessageContent {
            message_id: "m1".into(),
            delta: "lo".into(),
        },
        Event::TextMessageEnd {
            message_id: "m1".into(),
        },
        Event::ToolCallStart {
            tool_call_id: "t1".into(),
            tool_call_name: "Bash".into(),
            parent_message_id: Some("m1".into()),
        },
        Event::ToolCallArgs {
            tool_call_id: "t1".into(),
            delta: "{\"a\":".into(),
        },
        Event::ToolCallArgs {
            tool_call_id: "t1".into(),
            delta: "1}".into(),
        },
        Event::ToolCallEnd {
            tool_call_id: "t1".into(),
        },
        Event::ToolCallResult {
            message_id: "tr1".into(),
            tool_call_id: "t1".into(),
            content: "ok".into(),
        },
        Event::StepStarted {
            step_name: "s".into(),
        },
        Event::Custom {
            name: "x".into(),
            value: json!(1),
        },
    ]);
    assert_eq!(
        got,
        vec![
            json!({"id":"m1","role":"assistant","content":"Hello","toolCalls":[
                {"id":"t1","type":"function","function":{"name":"Bash","arguments":"{\"a\":1}"}}]}),
            json!({"id":"tr1","role":"tool","toolCallId":"t1","content":"ok"}),
        ]
    );
}

#[test]
fn a_tool_call_without_a_parent_gets_its_own_assistant_message() {
    let got = run(&[Event::ToolCallStart {
        tool_call_id: "t9".into(),
        tool_call_name: "Read".into(),
        parent_message_id: None,
    }]);
    assert_eq!(got[0]["id"], "t9");
    assert_eq!(got[0]["role"], "assistant");
    assert_eq!(got[0]["toolCalls"][0]["id"], "t9");
}

#[test]
fn reasoning_activity_interrupts_and_errors() {
    let interrupt = Interrupt {
        id: "int-1".into(),
        reason: "tool_call".into(),
        message: Some("May I?".into()),
        tool_call_id: Some("t1".into()),
        response_schema: None,
        expires_at: None,
        metadata: None,
    };
    let got = run(&[
        Event::ReasoningStart {
            message_id: "r1".into(),
        },
        Event::ReasoningMessageStart {
            message_id: "r1".into(),
        },
        Event::ReasoningMessageContent {
            message_id: "r1".into(),
            delta: "hmm".into(),
        },
        Event::ReasoningMessageEnd {
            message_id: "r1".into(),
        },
        Event::ReasoningEnd {
            message_id: "r1".into(),
        },
        Event::ActivitySnapshot {
            message_id: "a1".into(),
            activity_type: "plan".into(),
            content: json!({"step": 1}),
            replace: true,
        },
        Event::ActivitySnapshot {
            message_id: "a1".into(),
            activity_type: "plan".into(),
            content: json!({"step": 2}),
            replace: true,
        },
        Event::ActivitySnapshot {
            message_id: "a1".into(),
            activity_type: "plan".into(),
            content: json!({"step": 3}),
            replace: false,
        },
        Event::RunFinished {
            thread_id: "t".into(),
            run_id: "run-1".into(),
            outcome: Outcome::Interrupt(vec![interrupt]),
            usage: None,
        },
        Event::RunError {
            message: "boom".into(),
            code: "A2A_UNAVAILABLE".into(),
            usage: None,
        },
    ]);
    assert_eq!(
        got[0],
        json!({"id":"r1","role":"reasoning","content":"hmm"})
    );
    assert_eq!(
        got[1],
        json!({"id":"a1","role":"activity","activityType":"plan","content":{"step":2}})
    );
    assert_eq!(got[2]["id"], "run-1:interrupt:int-1");
    assert_eq!(got[2]["activityType"], INTERRUPT);
    assert_eq!(got[2]["content"]["interrupt"]["toolCallId"], "t1");
    assert_eq!(got[2]["content"]["interrupt"]["message"], "May I?");
    assert_eq!(
        got[3],
        json!({"id":"run-1:error","role":"activity","activityType":RUN_ERROR,
               "content":{"code":"A2A_UNAVAILABLE","message":"boom"}})
    );
    assert_eq!(got.len(), 4);
}

#[test]
fn user_messages_keep_text_and_name_images() {
    let mut r = Recorder::new("run-1");
    r.user("u1", &[a2a::Part::text("hi")]);
    r.user(
        "u2",
        &[
            a2a::Part::text("look"),
            a2a::Part::Data {
                data: json!({"filename": "a.png", "bytes": "AAAA"}),
                media_type: "image/png".into(),
            },
        ],
    );
    let got = r.take();
    assert_eq!(got[0], json!({"id":"u1","role":"user","content":"hi"}));
    assert_eq!(
        got[1],
        json!({"id":"u2","role":"user","content":[
            {"type":"text","text":"look"},{"type":"text","text":"[image image/png a.png]"}]})
    );
    assert!(
        !got[1].to_string().contains("AAAA"),
        "no image bytes are kept"
    );
}

#[test]
fn answers_keep_small_payloads_only() {
    let mut r = Recorder::new("run-2");
    r.answers(&[
        ResumeEntry {
            interrupt_id: "i1".into(),
            status: ResumeStatus::Resolved,
            payload: Some(json!({"approved": true})),
        },
        ResumeEntry {
            interrupt_id: "i2".into(),
            status: ResumeStatus::Resolved,
            payload: Some(json!("x".repeat(MAX_PAYLOAD_BYTES + 1))),
        },
        ResumeEntry {
            interrupt_id: "i3".into(),
            status: ResumeStatus::Cancelled,
            payload: None,
        },
    ]);
    let got = r.take();
    assert_eq!(
        got[0],
        json!({"id":"run-2:answer:i1","role":"activity","activityType":INTERRUPT_RESPONSE,
               "content":{"interruptId":"i1","status":"resolved","payload":{"approved":true}}})
    );
    assert_eq!(got[1]["content"]["payloadOmitted"], true);
    assert!(got[1]["content"].get("payload").is_none());
    assert_eq!(
        got[2]["content"],
        json!({"interruptId":"i3","status":"cancelled"})
    );
}

#[test]
fn text_is_cut_at_its_bound_on_a_character_boundary() {
    let mut r = Recorder::new("r");
    r.text("m", &"é".repeat(MAX_TEXT_BYTES));
    r.text("m", "more");
    let got = r.take();
    let s = got[0]["content"].as_str().unwrap();
    assert!(s.len() <= MAX_TEXT_BYTES && s.len() > MAX_TEXT_BYTES - 2);
    assert!(s.chars().all(|c| c == 'é'));
    assert!(r.is_empty());
}
