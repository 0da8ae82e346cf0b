//! The messages of one run, built from what it sends its client (pure).
//!
//! The recorder sees every event the run's output sends, in order, and folds it the way an
//! AG-UI client folds a stream into its message list: a text message's deltas into its
//! `content`, a tool call into its parent assistant message's `toolCalls`, a tool result into a
//! `tool` message, a reasoning message into a `reasoning` one, an activity snapshot into an
//! `activity` message. The user's message, the answers to interrupts, the interrupts a run ends
//! with and its error are recorded too: `activity` messages of their own types ([`INTERRUPT`],
//! [`INTERRUPT_RESPONSE`], [`RUN_ERROR`]), which every AG-UI client accepts and none sends back
//! to an agent. Images a user sent are not kept (a text part names each), and no text is kept
//! beyond [`MAX_TEXT_BYTES`] a message. The stores keep what is recorded (`store::transcript`).

use std::collections::HashMap;

use agui::{Event, Interrupt, Outcome};
use serde_json::{json, Map, Value};

use crate::validate::envelope::ResumeEntry;

/// Text kept of one message's content, a tool call's arguments or a tool result (the rest is
/// cut at a character boundary).
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// A resume answer's payload larger than this (as JSON) is not kept (its status is).
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024;

/// The `activityType` of an interrupt a run ended with.
pub const INTERRUPT: &str = "iac-code.interrupt";
/// The `activityType` of the answer a client sent to an interrupt.
pub const INTERRUPT_RESPONSE: &str = "iac-code.interrupt-response";
/// The `activityType` of a run's error (its code and message, as the client saw them).
pub const RUN_ERROR: &str = "iac-code.run-error";

/// The messages of a run, in the order they began.
#[derive(Debug, Default)]
pub struct Recorder {
    messages: Vec<Value>,
    /// Message id → its position.
    by_id: HashMap<String, usize>,
    /// Tool call id → (its message's position, its position in `toolCalls`).
    calls: HashMap<String, (usize, usize)>,
    run_id: String,
}

impl Recorder {
    pub fn new(run_id: &str) -> Recorder {
        Recorder {
            run_id: run_id.to_owned(),
            ..Recorder::default()
        }
    }

    /// The user's message of a new turn or a guidance run: its text, each image named.
    pub fn user(&mut self, message_id: &str, parts: &[a2a::Part]) {
        let mut content: Vec<Value> = parts
            .iter()
            .map(|p| match p {
                a2a::Part::Text { text } => json!({"type": "text", "text": cut(text)}),
                a2a::Part::Data { data, media_type } => {
                    let name = data.get("filename").and_then(Value::as_str).unwrap_or("");
                    json!({"type": "text", "text": format!("[image {media_type} {name}]").replace("  ", " ")})
                }
            })
            .collect();
        let content =
            if content.len() == 1 && parts.iter().all(|p| matches!(p, a2a::Part::Text { .. })) {
                content.remove(0)["text"].take()
            } else {
                Value::Array(content)
            };
        self.push(
            message_id,
            json!({"id": message_id, "role": "user", "content": content}),
        );
    }

    /// The answers of a resume, one `activity` message each.
    pub fn answers(&mut self, entries: &[ResumeEntry]) {
        for e in entries {
            let id = format!("{}:answer:{}", self.run_id, e.interrupt_id);
            let mut content = Map::new();
            content.insert("interruptId".into(), json!(e.interrupt_id));
            content.insert("status".into(), json!(e.status.as_str()));
            if let Some(p) = &e.payload {
                let size = serde_json::to_vec(p).map_or(usize::MAX, |v| v.len());
                if size <= MAX_PAYLOAD_BYTES {
                    content.insert("payload".into(), p.clone());
                } else {
                    content.insert("payloadOmitted".into(), json!(true));
                }
            }
            self.activity(&id, INTERRUPT_RESPONSE, Value::Object(content));
        }
    }

    /// A text delta of the output's fast path.
    pub fn text(&mut self, message_id: &str, delta: &str) {
        let at = self.assistant(message_id);
        append(&mut self.messages[at]["content"], delta);
    }

    /// One event the run sent.
    pub fn event(&mut self, e: &Event) {
        match e {
            Event::TextMessageStart { message_id } => {
                self.assistant(message_id);
            }
            Event::TextMessageContent { message_id, delta } => self.text(message_id, delta),
            Event::ToolCallStart {
                tool_call_id,
                tool_call_name,
                parent_message_id,
            } => {
                let parent = parent_message_id.as_deref().unwrap_or(tool_call_id);
                let at = self.assistant(parent);
                let m = &mut self.messages[at];
                if !m.get("toolCalls").is_some_and(Value::is_array) {
                    m["toolCalls"] = json!([]);
                }
                let calls = m["toolCalls"].as_array_mut().expect("an array");
                calls.push(json!({
                    "id": tool_call_id,
                    "type": "function",
                    "function": {"name": tool_call_name, "arguments": ""},
                }));
                self.calls.insert(tool_call_id.clone(), (at, calls.len() - 1));
            }
            Event::ToolCallArgs {
                tool_call_id,
                delta,
            } => {
                if let Some(&(m, c)) = self.calls.get(tool_call_id) {
                    append(&mut self.messages[m]["toolCalls"][c]["function"]["arguments"], delta);
                }
            }
            Event::ToolCallResult {
                message_id,
                tool_call_id,
                content,
            } => self.push(
                message_id,
                json!({"id": message_id, "role": "tool", "toolCallId": tool_call_id, "content": cut(content)}),
            ),
            Event::ReasoningMessageStart { message_id } if !self.by_id.contains_key(message_id) => {
                self.push(message_id, json!({"id": message_id, "role": "reasoning", "content": ""}));
            }
            Event::ReasoningMessageContent { message_id, delta } => {
                if let Some(&at) = self.by_id.get(message_id) {
                    append(&mut self.messages[at]["content"], delta);
                }
            }
            Event::ActivitySnapshot {
                message_id,
                activity_type,
                content,
                replace,
            } => match self.by_id.get(message_id) {
                Some(&at) if *replace => self.messages[at]["content"] = content.clone(),
                Some(_) => {}
                None => self.activity(message_id, activity_type, content.clone()),
            },
            Event::RunFinished {
                outcome: Outcome::Interrupt(list),
                ..
            } => self.interrupts(list),
            Event::RunError { message, code, .. } => {
                let id = format!("{}:error", self.run_id);
                self.activity(&id, RUN_ERROR, json!({"code": code, "message": message}));
            }
            _ => {}
        }
    }

    /// The interrupts a run ended with, one `activity` message each (as the client got them).
    fn interrupts(&mut self, list: &[Interrupt]) {
        for i in list {
            let id = format!("{}:interrupt:{}", self.run_id, i.id);
            let content = serde_json::to_value(i).unwrap_or(Value::Null);
            self.activity(&id, INTERRUPT, json!({ "interrupt": content }));
        }
    }

    /// The messages recorded so far, taken (the recorder starts over).
    pub fn take(&mut self) -> Vec<Value> {
        self.by_id.clear();
        self.calls.clear();
        std::mem::take(&mut self.messages)
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    fn activity(&mut self, id: &str, kind: &str, content: Value) {
        let content = if content.is_object() {
            content
        } else {
            json!({ "value": content })
        };
        self.push(
            id,
            json!({"id": id, "role": "activity", "activityType": kind, "content": content}),
        );
    }

    /// The assistant message `id`, begun if new.
    fn assistant(&mut self, id: &str) -> usize {
        if let Some(&at) = self.by_id.get(id) {
            return at;
        }
        self.push(id, json!({"id": id, "role": "assistant", "content": ""}));
        self.messages.len() - 1
    }

    fn push(&mut self, id: &str, message: Value) {
        self.by_id.insert(id.to_owned(), self.messages.len());
        self.messages.push(message);
    }
}

/// Appends `delta` to a string value, within [`MAX_TEXT_BYTES`].
fn append(v: &mut Value, delta: &str) {
    if let Value::String(s) = v {
        let room = MAX_TEXT_BYTES.saturating_sub(s.len());
        s.push_str(prefix(delta, room));
    }
}

fn cut(s: &str) -> &str {
    prefix(s, MAX_TEXT_BYTES)
}

/// The longest prefix of `s` within `max` bytes that ends on a character boundary.
fn prefix(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
