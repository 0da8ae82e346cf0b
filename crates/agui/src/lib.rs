//! AG-UI wire types and the SSE encoder.
//!
//! Output speaks the event set of `@ag-ui/core` 0.0.58 / `ag-ui-protocol` 0.1.20: START/CONTENT/END
//! (never CHUNK), no 1.0-only events. A client that declares AG-UI 1.0 ([`Dialect::V1`]) also gets
//! the two 1.0 additions this gateway has a use for: `RUN_STARTED.protocolVersion` and the
//! `cancelled` outcome; nothing else differs. Every event is written as one SSE record
//! `data: <compact json>\n\n` with `type` first, then an integer millisecond `timestamp`, then the
//! event's fields. Absent optional fields are omitted (never `null`); nulls inside free-form values
//! (`CUSTOM.value`, interrupt `metadata`, `ACTIVITY_SNAPSHOT.content`) are kept.
#![forbid(unsafe_code)]

mod code;
pub use code::Code;

use serde::Serialize;
use serde_json::Value;

/// The SSE comment written after 15 s without an event.
pub const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// The AG-UI protocol version this producer declares to a 1.0 client.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The protocol versions a client may declare in `RunAgentInput.protocolVersion`.
pub const SUPPORTED_VERSIONS: [&str; 1] = [PROTOCOL_VERSION];

/// What a client speaks, from its `RunAgentInput.protocolVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dialect {
    /// No version declared: the pre-1.0 wire (`@ag-ui/client` 0.0.x, CopilotKit), byte for byte
    /// what the gateway always sent. 0.0.58 and 0.0.59 reject 1.0-only shapes outright.
    #[default]
    Legacy,
    /// AG-UI 1.x: `RUN_STARTED` declares [`PROTOCOL_VERSION`], a cancelled run finishes with the
    /// `cancelled` outcome.
    V1,
}

impl Dialect {
    /// Negotiates from the declared version: absent (or JSON null) is the legacy wire; `"1"`,
    /// `"1.<minor>"` or `"1.<minor>.<patch>"` (releases within a major version are compatible) is
    /// 1.0. Anything else, including another type, is `None`: a version this producer does not
    /// speak.
    pub fn negotiate(declared: Option<&Value>) -> Option<Dialect> {
        match declared {
            None | Some(Value::Null) => Some(Dialect::Legacy),
            Some(Value::String(v)) => {
                let mut parts = v.split('.');
                let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                let major = parts.next() == Some("1");
                let rest: Vec<&str> = parts.collect();
                (major && rest.len() <= 2 && rest.iter().all(|p| digits(p))).then_some(Dialect::V1)
            }
            Some(_) => None,
        }
    }
}

/// One token-usage record, as aggregated onto `RUN_FINISHED` / `RUN_ERROR`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub cached_input_tokens: u64,
}

/// An AG-UI `Interrupt` as carried by `RUN_FINISHED.outcome.interrupts`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    pub id: String,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
}

/// `RUN_FINISHED.outcome`.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Success,
    Interrupt(Vec<Interrupt>),
    /// 1.0 only: the run was stopped on request and did not fail.
    Cancelled,
}

/// Every event type this crate builds, in [`Event::type_index`] order.
pub const EVENT_TYPES: [&str; 20] = [
    "RUN_STARTED",
    "RUN_FINISHED",
    "RUN_ERROR",
    "STEP_STARTED",
    "STEP_FINISHED",
    "TEXT_MESSAGE_START",
    "TEXT_MESSAGE_CONTENT",
    "TEXT_MESSAGE_END",
    "TOOL_CALL_START",
    "TOOL_CALL_ARGS",
    "TOOL_CALL_END",
    "TOOL_CALL_RESULT",
    "REASONING_START",
    "REASONING_MESSAGE_START",
    "REASONING_MESSAGE_CONTENT",
    "REASONING_MESSAGE_END",
    "REASONING_END",
    "ACTIVITY_SNAPSHOT",
    "CUSTOM",
    "MESSAGES_SNAPSHOT",
];

/// [`Event::type_index`] of `TEXT_MESSAGE_CONTENT` (the text fast path has no event to ask).
pub const TEXT_MESSAGE_CONTENT_INDEX: usize = 6;

/// One AG-UI event (without its timestamp, which is stamped at encoding time).
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    RunStarted {
        thread_id: String,
        run_id: String,
        parent_run_id: Option<String>,
        /// Declared to 1.0 clients only ([`PROTOCOL_VERSION`]).
        protocol_version: Option<&'static str>,
    },
    RunFinished {
        thread_id: String,
        run_id: String,
        outcome: Outcome,
        usage: Option<Vec<Usage>>,
    },
    /// `RUN_ERROR {message, code, usage?}`. Unlike the Python reference, no `threadId`/`runId`:
    /// they are not part of the event and `@ag-ui/client` 1.0 strips them with an
    /// `[ag-ui][enforce]` warning (decisions: output passes both clients with no warning).
    RunError {
        message: String,
        code: String,
        usage: Option<Vec<Usage>>,
    },
    StepStarted {
        step_name: String,
    },
    StepFinished {
        step_name: String,
    },
    TextMessageStart {
        message_id: String,
    },
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    TextMessageEnd {
        message_id: String,
    },
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
        parent_message_id: Option<String>,
    },
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    ToolCallEnd {
        tool_call_id: String,
    },
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
    },
    ReasoningStart {
        message_id: String,
    },
    ReasoningMessageStart {
        message_id: String,
    },
    ReasoningMessageContent {
        message_id: String,
        delta: String,
    },
    ReasoningMessageEnd {
        message_id: String,
    },
    ReasoningEnd {
        message_id: String,
    },
    ActivitySnapshot {
        message_id: String,
        activity_type: String,
        content: Value,
        replace: bool,
    },
    Custom {
        name: String,
        value: Value,
    },
    /// A thread's messages, whole (AG-UI messages, as a client keeps them).
    MessagesSnapshot {
        messages: Vec<Value>,
    },
}

impl Event {
    /// The AG-UI `type` discriminator.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "RUN_STARTED",
            Event::RunFinished { .. } => "RUN_FINISHED",
            Event::RunError { .. } => "RUN_ERROR",
            Event::StepStarted { .. } => "STEP_STARTED",
            Event::StepFinished { .. } => "STEP_FINISHED",
            Event::TextMessageStart { .. } => "TEXT_MESSAGE_START",
            Event::TextMessageContent { .. } => "TEXT_MESSAGE_CONTENT",
            Event::TextMessageEnd { .. } => "TEXT_MESSAGE_END",
            Event::ToolCallStart { .. } => "TOOL_CALL_START",
            Event::ToolCallArgs { .. } => "TOOL_CALL_ARGS",
            Event::ToolCallEnd { .. } => "TOOL_CALL_END",
            Event::ToolCallResult { .. } => "TOOL_CALL_RESULT",
            Event::ReasoningStart { .. } => "REASONING_START",
            Event::ReasoningMessageStart { .. } => "REASONING_MESSAGE_START",
            Event::ReasoningMessageContent { .. } => "REASONING_MESSAGE_CONTENT",
            Event::ReasoningMessageEnd { .. } => "REASONING_MESSAGE_END",
            Event::ReasoningEnd { .. } => "REASONING_END",
            Event::ActivitySnapshot { .. } => "ACTIVITY_SNAPSHOT",
            Event::Custom { .. } => "CUSTOM",
            Event::MessagesSnapshot { .. } => "MESSAGES_SNAPSHOT",
        }
    }

    /// The position of this event's type in [`EVENT_TYPES`] (counters indexed by type).
    pub fn type_index(&self) -> usize {
        match self {
            Event::RunStarted { .. } => 0,
            Event::RunFinished { .. } => 1,
            Event::RunError { .. } => 2,
            Event::StepStarted { .. } => 3,
            Event::StepFinished { .. } => 4,
            Event::TextMessageStart { .. } => 5,
            Event::TextMessageContent { .. } => TEXT_MESSAGE_CONTENT_INDEX,
            Event::TextMessageEnd { .. } => 7,
            Event::ToolCallStart { .. } => 8,
            Event::ToolCallArgs { .. } => 9,
            Event::ToolCallEnd { .. } => 10,
            Event::ToolCallResult { .. } => 11,
            Event::ReasoningStart { .. } => 12,
            Event::ReasoningMessageStart { .. } => 13,
            Event::ReasoningMessageContent { .. } => 14,
            Event::ReasoningMessageEnd { .. } => 15,
            Event::ReasoningEnd { .. } => 16,
            Event::ActivitySnapshot { .. } => 17,
            Event::Custom { .. } => 18,
            Event::MessagesSnapshot { .. } => 19,
        }
    }

    /// True for `RUN_FINISHED` and `RUN_ERROR`.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Event::RunFinished { .. } | Event::RunError { .. })
    }

    /// Appends this event as one SSE record (`data: {...}\n\n`) to `out`.
    pub fn encode_sse(&self, timestamp_ms: i64, out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: ");
        self.encode_json(timestamp_ms, out);
        out.extend_from_slice(b"\n\n");
    }

    /// Appends the SSE record of `TEXT_MESSAGE_CONTENT {message_id, delta}` to `out` without
    /// building the event (the per-delta hot path); the bytes are those of
    /// [`Event::encode_sse`].
    pub fn encode_text_content_sse(
        timestamp_ms: i64,
        message_id: &str,
        delta: &str,
        out: &mut Vec<u8>,
    ) {
        out.extend_from_slice(b"data: ");
        let mut w = ObjWriter::new(out);
        w.raw_str("type", "TEXT_MESSAGE_CONTENT");
        w.int("timestamp", timestamp_ms);
        w.str("messageId", message_id);
        w.str("delta", delta);
        w.finish();
        out.extend_from_slice(b"\n\n");
    }

    /// Appends this event's compact JSON object to `out`.
    pub fn encode_json(&self, timestamp_ms: i64, out: &mut Vec<u8>) {
        let mut w = ObjWriter::new(out);
        w.raw_str("type", self.type_name());
        w.int("timestamp", timestamp_ms);
        match self {
            Event::RunStarted {
                thread_id,
                run_id,
                parent_run_id,
                protocol_version,
            } => {
                w.str("threadId", thread_id);
                w.str("runId", run_id);
                if let Some(p) = parent_run_id {
                    w.str("parentRunId", p);
                }
                if let Some(v) = protocol_version {
                    w.str("protocolVersion", v);
                }
            }
            Event::RunFinished {
                thread_id,
                run_id,
                outcome,
                usage,
            } => {
                w.str("threadId", thread_id);
                w.str("runId", run_id);
                match outcome {
                    Outcome::Success => w.raw("outcome", br#"{"type":"success"}"#),
                    Outcome::Cancelled => w.raw("outcome", br#"{"type":"cancelled"}"#),
                    Outcome::Interrupt(list) => {
                        w.key("outcome");
                        w.out
                            .extend_from_slice(br#"{"type":"interrupt","interrupts":"#);
                        serde_json::to_writer(&mut *w.out, list).expect("interrupts serialise");
                        w.out.push(b'}');
                    }
                }
                if let Some(u) = usage {
                    w.ser("usage", u);
                }
            }
            Event::RunError {
                message,
                code,
                usage,
            } => {
                w.str("message", message);
                w.str("code", code);
                if let Some(u) = usage {
                    w.ser("usage", u);
                }
            }
            Event::StepStarted { step_name } | Event::StepFinished { step_name } => {
                w.str("stepName", step_name);
            }
            Event::TextMessageStart { message_id } => {
                w.str("messageId", message_id);
                w.raw_str("role", "assistant");
            }
            Event::TextMessageContent { message_id, delta }
            | Event::ReasoningMessageContent { message_id, delta } => {
                w.str("messageId", message_id);
                w.str("delta", delta);
            }
            Event::TextMessageEnd { message_id }
            | Event::ReasoningStart { message_id }
            | Event::ReasoningMessageEnd { message_id }
            | Event::ReasoningEnd { message_id } => {
                w.str("messageId", message_id);
            }
            Event::ReasoningMessageStart { message_id } => {
                w.str("messageId", message_id);
                w.raw_str("role", "reasoning");
            }
            Event::ToolCallStart {
                tool_call_id,
                tool_call_name,
                parent_message_id,
            } => {
                w.str("toolCallId", tool_call_id);
                w.str("toolCallName", tool_call_name);
                if let Some(p) = parent_message_id {
                    w.str("parentMessageId", p);
                }
            }
            Event::ToolCallArgs {
                tool_call_id,
                delta,
            } => {
                w.str("toolCallId", tool_call_id);
                w.str("delta", delta);
            }
            Event::ToolCallEnd { tool_call_id } => {
                w.str("toolCallId", tool_call_id);
            }
            Event::ToolCallResult {
                message_id,
                tool_call_id,
                content,
            } => {
                w.str("messageId", message_id);
                w.str("toolCallId", tool_call_id);
                w.str("content", content);
                w.raw_str("role", "tool");
            }
            Event::ActivitySnapshot {
                message_id,
                activity_type,
                content,
                replace,
            } => {
                w.str("messageId", message_id);
                w.str("activityType", activity_type);
                w.ser("content", content);
                w.raw("replace", if *replace { b"true" } else { b"false" });
            }
            Event::Custom { name, value } => {
                w.str("name", name);
                w.ser("value", value);
            }
            Event::MessagesSnapshot { messages } => w.ser("messages", messages),
        }
        w.finish();
    }

    /// The event as a `serde_json::Value` (tests and diagnostics; not used on the hot path).
    pub fn to_value(&self, timestamp_ms: i64) -> Value {
        let mut buf = Vec::new();
        self.encode_json(timestamp_ms, &mut buf);
        serde_json::from_slice(&buf).expect("encoded event is JSON")
    }
}

/// Minimal writer for a JSON object with keys in insertion order.
struct ObjWriter<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> ObjWriter<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        ObjWriter { out, first: true }
    }
    fn key(&mut self, k: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(k.as_bytes());
        self.out.extend_from_slice(b"\":");
    }
    /// A string value that needs no escaping (static identifiers).
    fn raw_str(&mut self, k: &str, v: &str) {
        self.key(k);
        self.out.push(b'"');
        self.out.extend_from_slice(v.as_bytes());
        self.out.push(b'"');
    }
    fn str(&mut self, k: &str, v: &str) {
        self.key(k);
        serde_json::to_writer(&mut *self.out, v).expect("string serialises");
    }
    fn int(&mut self, k: &str, v: i64) {
        self.key(k);
        use std::io::Write as _;
        write!(self.out, "{v}").expect("write to Vec");
    }
    fn raw(&mut self, k: &str, v: &[u8]) {
        self.key(k);
        self.out.extend_from_slice(v);
    }
    fn ser<T: Serialize + ?Sized>(&mut self, k: &str, v: &T) {
        self.key(k);
        serde_json::to_writer(&mut *self.out, v).expect("value serialises");
    }
    fn finish(self) {
        self.out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enc(e: &Event) -> String {
        let mut b = Vec::new();
        e.encode_sse(1795980985782, &mut b);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn text_content_hot_path_encodes_the_same_bytes() {
        for (id, delta) in [
            ("m1", "hello"),
            ("msg-\u{7f}\"x", "line\nbreak\t\\ \u{1}\u{2028}中文🙂"),
            ("", ""),
        ] {
            let e = Event::TextMessageContent {
                message_id: id.into(),
                delta: delta.into(),
            };
            let mut fast = Vec::new();
            Event::encode_text_content_sse(1795980985782, id, delta, &mut fast);
            assert_eq!(String::from_utf8(fast).unwrap(), enc(&e));
        }
    }

    #[test]
    fn run_started_matches_reference_bytes() {
        let e = Event::RunStarted {
            thread_id: "thread-s1".into(),
            run_id: "run-s1-1".into(),
            parent_run_id: None,
            protocol_version: None,
        };
        assert_eq!(
            enc(&e),
            "data: {\"type\":\"RUN_STARTED\",\"timestamp\":1795980985782,\"threadId\":\"thread-s1\",\"runId\":\"run-s1-1\"}\n\n"
        );
    }

    #[test]
    fn a_1_0_client_gets_the_declared_version_and_the_cancelled_outcome() {
        let started = Event::RunStarted {
            thread_id: "t".into(),
            run_id: "r".into(),
            parent_run_id: Some("p".into()),
            protocol_version: Some(PROTOCOL_VERSION),
        };
        assert_eq!(
            enc(&started),
            "data: {\"type\":\"RUN_STARTED\",\"timestamp\":1795980985782,\"threadId\":\"t\",\"runId\":\"r\",\"parentRunId\":\"p\",\"protocolVersion\":\"1.0\"}\n\n"
        );
        let finished = Event::RunFinished {
            thread_id: "t".into(),
            run_id: "r".into(),
            outcome: Outcome::Cancelled,
            usage: None,
        };
        assert_eq!(
            finished.to_value(1),
            json!({"type":"RUN_FINISHED","timestamp":1,"threadId":"t","runId":"r","outcome":{"type":"cancelled"}})
        );
    }

    #[test]
    fn negotiation_accepts_1_x_and_absence_and_refuses_anything_else() {
        for (v, d) in [
            (None, Some(Dialect::Legacy)),
            (Some(json!(null)), Some(Dialect::Legacy)),
            (Some(json!("1.0")), Some(Dialect::V1)),
            (Some(json!("1")), Some(Dialect::V1)),
            (Some(json!("1.3")), Some(Dialect::V1)),
            (Some(json!("1.12")), Some(Dialect::V1)),
            (Some(json!("2.0")), None),
            (Some(json!("0.1")), None),
            (Some(json!("abc")), None),
            (Some(json!("1.")), None),
            (Some(json!("1.0.0")), Some(Dialect::V1)),
            (Some(json!("1.0.0.0")), None),
            (Some(json!("10.0")), None),
            (Some(json!("1.x")), None),
            (Some(json!(" 1.0")), None),
            (Some(json!("")), None),
            (Some(json!(1.0)), None),
            (Some(json!(["1.0"])), None),
        ] {
            assert_eq!(Dialect::negotiate(v.as_ref()), d, "{v:?}");
        }
    }

    #[test]
    fn run_error_key_order_and_optional_usage() {
        let e = Event::RunError {
            message: "A new run requires a user message.".into(),
            code: "INVALID_INPUT".into(),
            usage: None,
        };
        assert_eq!(
            enc(&e),
            "data: {\"type\":\"RUN_ERROR\",\"timestamp\":1795980985782,\"message\":\"A new run requires a user message.\",\"code\":\"INVALID_INPUT\"}\n\n"
        );
    }

    #[test]
    fn interrupt_outcome_omits_absent_fields_and_keeps_nulls_in_metadata() {
        let e = Event::RunFinished {
            thread_id: "t".into(),
            run_id: "r".into(),
            outcome: Outcome::Interrupt(vec![Interrupt {
                id: "i1".into(),
                reason: "tool_call".into(),
                message: Some("m".into()),
                tool_call_id: None,
                response_schema: Some(json!({"type":"object"})),
                expires_at: None,
                metadata: Some(json!({"x": null})),
            }]),
            usage: Some(vec![Usage {
                provider: None,
                model: Some("m".into()),
                input_tokens: 1,
                output_tokens: 2,
                total_tokens: 3,
                cached_input_tokens: 0,
            }]),
        };
        let v = e.to_value(5);
        assert_eq!(
            v,
            json!({"type":"RUN_FINISHED","timestamp":5,"threadId":"t","runId":"r",
                "outcome":{"type":"interrupt","interrupts":[{"id":"i1","reason":"tool_call","message":"m",
                "responseSchema":{"type":"object"},"metadata":{"x":null}}]},
                "usage":[{"model":"m","inputTokens":1,"outputTokens":2,"totalTokens":3,"cachedInputTokens":0}]})
        );
    }

    #[test]
    fn non_ascii_is_raw_utf8_and_escapes_are_json() {
        let e = Event::TextMessageContent {
            message_id: "m".into(),
            delta: "中文 \"q\"\n".into(),
        };
        let s = enc(&e);
        assert!(s.contains("\"delta\":\"中文 \\\"q\\\"\\n\""), "{s}");
    }

    #[test]
    fn every_variant_encodes_to_an_object_with_type_first() {
        let all = vec![
            Event::StepStarted {
                step_name: "s".into(),
            },
            Event::StepFinished {
                step_name: "s".into(),
            },
            Event::TextMessageStart {
                message_id: "m".into(),
            },
            Event::TextMessageEnd {
                message_id: "m".into(),
            },
            Event::ToolCallStart {
                tool_call_id: "t".into(),
                tool_call_name: "bash".into(),
                parent_message_id: Some("m".into()),
            },
            Event::ToolCallArgs {
                tool_call_id: "t".into(),
                delta: "{}".into(),
            },
            Event::ToolCallEnd {
                tool_call_id: "t".into(),
            },
            Event::ToolCallResult {
                message_id: "tool-result-t".into(),
                tool_call_id: "t".into(),
                content: "ok".into(),
            },
            Event::ReasoningStart {
                message_id: "r".into(),
            },
            Event::ReasoningMessageStart {
                message_id: "r".into(),
            },
            Event::ReasoningMessageContent {
                message_id: "r".into(),
                delta: "d".into(),
            },
            Event::ReasoningMessageEnd {
                message_id: "r".into(),
            },
            Event::ReasoningEnd {
                message_id: "r".into(),
            },
            Event::ActivitySnapshot {
                message_id: "pipeline:p".into(),
                activity_type: "iac-code.pipeline.v1".into(),
                content: json!({"a":1}),
                replace: true,
            },
            Event::Custom {
                name: "n".into(),
                value: json!(null),
            },
        ];
        for e in all {
            let s = enc(&e);
            let expected_prefix = format!("data: {{\"type\":\"{}\",\"timestamp\":", e.type_name());
            assert!(s.starts_with(&expected_prefix), "{s}");
            assert!(s.ends_with("}\n\n"));
            let v: Value = serde_json::from_str(&s[6..s.len() - 2]).unwrap();
            assert_eq!(v["type"], e.type_name());
        }
        let tr = Event::ToolCallResult {
            message_id: "x".into(),
            tool_call_id: "t".into(),
            content: "c".into(),
        }
        .to_value(1);
        assert_eq!(tr["role"], "tool");
        let rs = Event::ReasoningMessageStart {
            message_id: "r".into(),
        }
        .to_value(1);
        assert_eq!(rs["role"], "reasoning");
    }

    /// Each event's index names its own type in `EVENT_TYPES` (counters by type rely on it).
    #[test]
    fn type_indexes_match_type_names() {
        let s = String::new;
        let events = [
            Event::RunStarted {
                thread_id: s(),
                run_id: s(),
                parent_run_id: None,
                protocol_version: None,
            },
            Event::RunFinished {
                thread_id: s(),
                run_id: s(),
                outcome: Outcome::Success,
                usage: None,
            },
            Event::RunError {
                message: s(),
                code: s(),
                usage: None,
            },
            Event::StepStarted { step_name: s() },
            Event::StepFinished { step_name: s() },
            Event::TextMessageStart { message_id: s() },
            Event::TextMessageContent {
                message_id: s(),
                delta: s(),
            },
            Event::TextMessageEnd { message_id: s() },
            Event::ToolCallStart {
                tool_call_id: s(),
                tool_call_name: s(),
                parent_message_id: None,
            },
            Event::ToolCallArgs {
                tool_call_id: s(),
                delta: s(),
            },
            Event::ToolCallEnd { tool_call_id: s() },
            Event::ToolCallResult {
                message_id: s(),
                tool_call_id: s(),
                content: s(),
            },
            Event::ReasoningStart { message_id: s() },
            Event::ReasoningMessageStart { message_id: s() },
            Event::ReasoningMessageContent {
                message_id: s(),
                delta: s(),
            },
            Event::ReasoningMessageEnd { message_id: s() },
            Event::ReasoningEnd { message_id: s() },
            Event::ActivitySnapshot {
                message_id: s(),
                activity_type: s(),
                content: Value::Null,
                replace: false,
            },
            Event::Custom {
                name: s(),
                value: Value::Null,
            },
            Event::MessagesSnapshot { messages: vec![] },
        ];
        assert_eq!(events.len(), EVENT_TYPES.len());
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.type_index(), i, "{}", e.type_name());
            assert_eq!(EVENT_TYPES[i], e.type_name());
        }
        assert_eq!(
            EVENT_TYPES[TEXT_MESSAGE_CONTENT_INDEX],
            "TEXT_MESSAGE_CONTENT"
        );
    }
}
