//! The RunAgentInput envelope (the ag-ui 0.1.20 model): ids must be non-empty strings, unknown
//! top-level fields are ignored. `protocolVersion` selects the dialect of the answer; a version
//! the gateway does not speak is refused first, with the supported versions in the message.
//!
//! Required: `threadId`, `runId` (non-empty strings), `state`, `messages`, `tools`, `context`,
//! `forwardedProps`. camelCase and snake_case spellings are both accepted; unknown fields are
//! ignored everywhere; every AG-UI message role is accepted in history. The ids the gateway keeps
//! (`threadId`, `runId`, `parentRunId`, each `resume[].interruptId`) are bounded
//! (`super::is_bounded`), each checked right after its own shape and refused with a message
//! naming it.

use serde_json::{Map, Value};

use crate::error::{msg, ApiError, Code};

/// A resume entry's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

impl ResumeStatus {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One `resume[]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeEntry {
    pub interrupt_id: String,
    pub status: ResumeStatus,
    /// `None` when absent or JSON null.
    pub payload: Option<Value>,
}

/// The envelope after validation.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub thread_id: String,
    pub run_id: String,
    pub parent_run_id: Option<String>,
    /// The history; taken once the latest user message is read from it (a run does not keep it).
    pub messages: Vec<Value>,
    pub tools_len: usize,
    /// `Some` (possibly empty) when the request is a resume.
    pub resume: Option<Vec<ResumeEntry>>,
    /// The protocol the client declared (absent: the pre-1.0 wire).
    pub dialect: agui::Dialect,
}

fn invalid() -> ApiError {
    ApiError::new(Code::InvalidInput, msg::INVALID_ENVELOPE)
}

/// `id` if it is bounded, else the refusal naming its field.
fn bounded(id: &str, refusal: &'static str) -> Result<(), ApiError> {
    if super::is_bounded(id) {
        Ok(())
    } else {
        Err(ApiError::new(Code::InvalidInput, refusal))
    }
}

/// Reads a field by its camelCase name or its snake_case alias.
pub(crate) fn field<'a>(
    obj: &'a Map<String, Value>,
    camel: &str,
    snake: &str,
) -> Option<&'a Value> {
    obj.get(camel).or_else(|| obj.get(snake))
}

fn req_str<'a>(obj: &'a Map<String, Value>, camel: &str, snake: &str) -> Result<&'a str, ApiError> {
    field(obj, camel, snake)
        .and_then(Value::as_str)
        .ok_or_else(invalid)
}

fn opt_str(obj: &Map<String, Value>, camel: &str, snake: &str) -> Result<Option<String>, ApiError> {
    match field(obj, camel, snake) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid()),
    }
}

fn req_array<'a>(
    obj: &'a Map<String, Value>,
    camel: &str,
    snake: &str,
) -> Result<&'a Vec<Value>, ApiError> {
    field(obj, camel, snake)
        .and_then(Value::as_array)
        .ok_or_else(invalid)
}

fn check_source(src: &Value) -> Result<(), ApiError> {
    let s = src.as_object().ok_or_else(invalid)?;
    match s.get("type").and_then(Value::as_str) {
        Some("data") => {
            req_str(s, "value", "value")?;
            req_str(s, "mimeType", "mime_type")?;
        }
        Some("url") | Some("file") => {
            req_str(s, "value", "value")?;
            opt_str(s, "mimeType", "mime_type")?;
        }
        _ => return Err(invalid()),
    }
    Ok(())
}

fn check_part(p: &Value) -> Result<(), ApiError> {
    let o = p.as_object().ok_or_else(invalid)?;
    match o.get("type").and_then(Value::as_str) {
        Some("text") => {
            req_str(o, "text", "text")?;
        }
        Some("image" | "audio" | "video" | "document") => {
            check_source(o.get("source").ok_or_else(invalid)?)?;
        }
        Some("binary") => {
            req_str(o, "mimeType", "mime_type")?;
            let any = ["id", "url", "data"]
                .iter()
                .any(|k| matches!(o.get(*k), Some(Value::String(_))));
            if !any {
                return Err(invalid());
            }
            for k in ["id", "url", "data", "filename"] {
                opt_str(o, k, k)?;
            }
        }
        _ => return Err(invalid()),
    }
    Ok(())
}

fn check_message(m: &Value) -> Result<(), ApiError> {
    let o = m.as_object().ok_or_else(invalid)?;
    req_str(o, "id", "id")?;
    match o.get("role").and_then(Value::as_str) {
        Some("user") => {
            opt_str(o, "name", "name")?;
            match o.get("content") {
                Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => parts.iter().try_for_each(check_part)?,
                _ => return Err(invalid()),
            }
        }
        Some("assistant") => {
            opt_str(o, "content", "content")?;
            match field(o, "toolCalls", "tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(calls)) => {
                    for c in calls {
                        let c = c.as_object().ok_or_else(invalid)?;
                        req_str(c, "id", "id")?;
                        if c.get("type").and_then(Value::as_str) != Some("function") {
                            return Err(invalid());
                        }
                        let f = c
                            .get("function")
                            .and_then(Value::as_object)
                            .ok_or_else(invalid)?;
                        req_str(f, "name", "name")?;
                        req_str(f, "arguments", "arguments")?;
                    }
                }
                Some(_) => return Err(invalid()),
            }
        }
        Some("system" | "developer" | "reasoning") => {
            req_str(o, "content", "content")?;
        }
        Some("tool") => {
            match o.get("content") {
                Some(Value::String(_)) => {}
                Some(Value::Array(parts)) => parts.iter().try_for_each(check_part)?,
                _ => return Err(invalid()),
            }
            req_str(o, "toolCallId", "tool_call_id")?;
            opt_str(o, "error", "error")?;
        }
        Some("activity") => {
            req_str(o, "activityType", "activity_type")?;
            o.get("content")
                .and_then(Value::as_object)
                .ok_or_else(invalid)?;
        }
        _ => return Err(invalid()),
    }
    Ok(())
}

/// Validates the envelope of a parsed JSON object.
pub fn parse(body: &Map<String, Value>) -> Result<Envelope, ApiError> {
    // First: a client of another protocol version would get misleading envelope errors otherwise.
    let dialect = agui::Dialect::negotiate(field(body, "protocolVersion", "protocol_version"))
        .ok_or_else(|| ApiError::new(Code::InvalidInput, msg::UNSUPPORTED_PROTOCOL))?;
    let thread_id = req_str(body, "threadId", "thread_id")?;
    let run_id = req_str(body, "runId", "run_id")?;
    // Ids must be non-empty strings.
    if thread_id.is_empty() || run_id.is_empty() {
        return Err(invalid());
    }
    bounded(thread_id, msg::ID_THREAD)?;
    bounded(run_id, msg::ID_RUN)?;
    let parent_run_id = opt_str(body, "parentRunId", "parent_run_id")?;
    if let Some(p) = &parent_run_id {
        bounded(p, msg::ID_PARENT_RUN)?;
    }
    if field(body, "state", "state").is_none() {
        return Err(invalid());
    }
    let messages = req_array(body, "messages", "messages")?;
    messages.iter().try_for_each(check_message)?;
    let tools = req_array(body, "tools", "tools")?;
    for t in tools {
        let t = t.as_object().ok_or_else(invalid)?;
        req_str(t, "name", "name")?;
        req_str(t, "description", "description")?;
    }
    let context = req_array(body, "context", "context")?;
    for c in context {
        let c = c.as_object().ok_or_else(invalid)?;
        req_str(c, "description", "description")?;
        req_str(c, "value", "value")?;
    }
    if field(body, "forwardedProps", "forwarded_props").is_none() {
        return Err(invalid());
    }
    let resume = match body.get("resume") {
        None | Some(Value::Null) => None,
        Some(Value::Array(entries)) => {
            let mut out = Vec::with_capacity(entries.len());
            for e in entries {
                let e = e.as_object().ok_or_else(invalid)?;
                let interrupt_id = req_str(e, "interruptId", "interrupt_id")?.to_owned();
                bounded(&interrupt_id, msg::ID_INTERRUPT)?;
                let status = match e.get("status").and_then(Value::as_str) {
                    Some("resolved") => ResumeStatus::Resolved,
                    Some("cancelled") => ResumeStatus::Cancelled,
                    _ => return Err(invalid()),
                };
                let payload = e.get("payload").filter(|p| !p.is_null()).cloned();
                out.push(ResumeEntry {
                    interrupt_id,
                    status,
                    payload,
                });
            }
            Some(out)
        }
        Some(_) => return Err(invalid()),
    };
    Ok(Envelope {
        thread_id: thread_id.to_owned(),
        run_id: run_id.to_owned(),
        parent_run_id,
        messages: messages.clone(),
        tools_len: tools.len(),
        resume,
        dialect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"threadId":"t","runId":"r","state":{},"messages":[{"id":"m","role":"user","content":"hi"}],
               "tools":[],"context":[],"forwardedProps":{}})
    }

    fn check(v: Value) -> Result<Envelope, ApiError> {
        parse(v.as_object().unwrap())
    }

    #[test]
    fn required_keys() {
        assert!(check(base()).is_ok());
        for k in [
            "threadId",
            "runId",
            "state",
            "messages",
            "tools",
            "context",
            "forwardedProps",
        ] {
            let mut v = base();
            v.as_object_mut().unwrap().remove(k);
            assert_eq!(check(v).unwrap_err().code, Code::InvalidInput, "{k}");
        }
        for k in ["messages", "tools", "context"] {
            let mut v = base();
            v[k] = Value::Null;
            assert!(check(v).is_err(), "{k}");
        }
        let mut v = base();
        v["state"] = Value::Null;
        assert!(check(v).is_ok());
        let mut v = base();
        v["threadId"] = json!("");
        assert!(check(v).is_err());
        let mut v = base();
        v["runId"] = json!("");
        assert!(check(v).is_err());
        let mut v = base();
        v["threadId"] = json!(5);
        assert!(check(v).is_err());
    }

    #[test]
    fn aliases_roles_and_parts() {
        let v = json!({"thread_id":"t","run_id":"r","state":1,"messages":[
            {"id":"a","role":"assistant","content":null,"toolCalls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"id":"b","role":"reasoning","content":"x"},
            {"id":"c","role":"activity","activityType":"x","content":{}},
            {"id":"d","role":"tool","content":"x","toolCallId":"c"},
            {"id":"e","role":"user","content":[{"type":"text","text":"a"},
                {"type":"image","source":{"type":"url","value":"http://x"}},
                {"type":"document","source":{"type":"file","value":"f"}},
                {"type":"binary","mimeType":"image/png","data":"AA=="}]}],
            "tools":[],"context":[{"description":"d","value":"v"}],"forwarded_props":null,
            "protocolVersion":"1.0","resume":[{"interruptId":"i","status":"cancelled","payload":null}]});
        let e = check(v).unwrap();
        assert_eq!(e.resume.unwrap()[0].payload, None);
        for bad in [
            json!({"id":"m","role":"bogus","content":"x"}),
            json!({"role":"user","content":"x"}),
            json!({"id":"m","role":"user","content":null}),
            json!({"id":"m","role":"tool","content":"x"}),
            json!({"id":"m","role":"user","content":[{"type":"binary","mimeType":"x"}]}),
            json!({"id":"m","role":"user","content":[{"type":"image","source":{"type":"data","value":"x"}}]}),
        ] {
            let mut v = base();
            v["messages"] = json!([bad]);
            assert!(check(v).is_err());
        }
        let mut v = base();
        v["resume"] = json!([{"interruptId":"a","status":"done"}]);
        assert!(check(v).is_err());
        let mut v = base();
        v["resume"] = json!([]);
        assert_eq!(check(v).unwrap().resume, Some(vec![]));
        let mut v = base();
        v["parentRunId"] = json!(3);
        assert!(check(v).is_err());
    }

    /// Each kept id over 256 bytes or with a control character is refused naming it, right after
    /// its own shape (an earlier fault still answers first); at the bound it is accepted.
    #[test]
    fn ids_are_bounded_and_refusals_name_them() {
        type Set = fn(&mut Value, Value);
        let fields: [(Set, &str); 4] = [
            (|b, v| b["threadId"] = v, msg::ID_THREAD),
            (|b, v| b["runId"] = v, msg::ID_RUN),
            (|b, v| b["parentRunId"] = v, msg::ID_PARENT_RUN),
            (
                |b, v| b["resume"] = json!([{"interruptId": v, "status": "resolved"}]),
                msg::ID_INTERRUPT,
            ),
        ];
        for (set, refusal) in fields {
            for bad in [
                "x".repeat(257),
                "a\u{0}".into(),
                "\u{7f}".into(),
                "\u{85}".into(),
            ] {
                let mut v = base();
                set(&mut v, json!(bad));
                let e = check(v).unwrap_err();
                assert_eq!(
                    (e.code, &*e.message),
                    (Code::InvalidInput, refusal),
                    "{bad:?}"
                );
            }
            let mut v = base();
            set(&mut v, json!("é".repeat(128)));
            assert!(check(v).is_ok(), "{refusal}");
        }
        // The order of the checks: an empty runId is still the envelope's refusal.
        let mut v = base();
        v["threadId"] = json!("a\u{0}");
        v["runId"] = json!("");
        assert_eq!(check(v).unwrap_err().message, msg::INVALID_ENVELOPE);
    }

    #[test]
    fn the_declared_protocol_version_selects_the_dialect_or_is_refused_first() {
        assert_eq!(check(base()).unwrap().dialect, agui::Dialect::Legacy);
        for v in ["1.0", "1.4"] {
            let mut b = base();
            b["protocolVersion"] = json!(v);
            assert_eq!(check(b).unwrap().dialect, agui::Dialect::V1, "{v}");
        }
        for v in [json!("2.0"), json!("abc"), json!(1)] {
            // Refused before the envelope's own checks: the version explains the rest.
            let mut b = base();
            b["protocolVersion"] = v.clone();
            b.as_object_mut().unwrap().remove("messages");
            let e = check(b).unwrap_err();
            assert_eq!(
                (e.code, &*e.message),
                (Code::InvalidInput, msg::UNSUPPORTED_PROTOCOL),
                "{v}"
            );
        }
        for supported in agui::SUPPORTED_VERSIONS {
            assert!(msg::UNSUPPORTED_PROTOCOL.contains(supported), "{supported}");
        }
    }
}
