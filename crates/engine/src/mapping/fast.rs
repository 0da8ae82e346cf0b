//! A borrowed, typed parser for the frame that makes up most of a kernel stream: a WORKING
//! `statusUpdate` whose agent message is text, of the task, context and session the run already
//! knows, with no metadata but the session id. Such a frame maps to text events only, so the
//! generic JSON tree (an ordered map per object, a `String` per key and value) is never built for
//! it. Anything else — an unknown key anywhere, another state, a new id, a non-text part, an error
//! — is `None`, and the caller takes the generic path, which stays the reference.

use std::borrow::Cow;

use serde::de::IgnoredAny;
use serde::Deserialize;

/// A text delta of the current task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextDelta {
    pub message_id: String,
    pub text: String,
}

/// What the run already knows; a frame naming anything else is not a fast frame.
#[derive(Debug, Clone, Copy)]
pub struct Known<'k> {
    pub task_id: &'k str,
    pub context_id: &'k str,
    pub session_id: Option<&'k str>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Frame<'a> {
    #[serde(borrow)]
    result: Res<'a>,
    #[serde(rename = "id")]
    _id: IgnoredAny,
    #[serde(rename = "jsonrpc")]
    _jsonrpc: IgnoredAny,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Res<'a> {
    #[serde(rename = "statusUpdate", borrow)]
    status_update: Update<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Update<'a> {
    #[serde(borrow)]
    task_id: Cow<'a, str>,
    #[serde(borrow)]
    context_id: Cow<'a, str>,
    #[serde(borrow)]
    status: Status<'a>,
    #[serde(default, borrow)]
    metadata: Option<Meta<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Status<'a> {
    #[serde(borrow)]
    state: Cow<'a, str>,
    #[serde(borrow)]
    message: Message<'a>,
    #[serde(default, rename = "timestamp")]
    _timestamp: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Message<'a> {
    #[serde(borrow)]
    message_id: Cow<'a, str>,
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow)]
    parts: Vec<Part<'a>>,
    #[serde(default, rename = "contextId")]
    _context_id: Option<IgnoredAny>,
    #[serde(default, rename = "taskId")]
    _task_id: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Part<'a> {
    #[serde(borrow)]
    text: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Meta<'a> {
    #[serde(borrow)]
    iac_code: Iac<'a>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Iac<'a> {
    #[serde(default, rename = "iacCodeSessionId", borrow)]
    session_id: Option<Cow<'a, str>>,
}

/// The text delta of `data` (one SSE frame's data), when it is a fast frame for `known`.
pub fn text_delta(data: &[u8], known: Known<'_>) -> Option<TextDelta> {
    let f: Frame<'_> = serde_json::from_slice(data).ok()?;
    let u = f.result.status_update;
    if u.task_id != known.task_id
        || u.context_id != known.context_id
        || u.status.state != a2a::TaskState::Working.wire_name()
    {
        return None;
    }
    if let Some(s) = u
        .metadata
        .and_then(|m| m.iac_code.session_id)
        .filter(|s| !s.is_empty())
    {
        if known.session_id != Some(&*s) {
            return None;
        }
    }
    let m = u.status.message;
    if a2a::Role::parse(&m.role) != Some(a2a::Role::Agent) || m.message_id.is_empty() {
        return None;
    }
    let text = match m.parts.len() {
        1 => m.parts.into_iter().next()?.text.into_owned(),
        _ => m.parts.iter().map(|p| &*p.text).collect(),
    };
    if text.is_empty() {
        return None;
    }
    Some(TextDelta {
        message_id: m.message_id.into_owned(),
        text,
    })
}
