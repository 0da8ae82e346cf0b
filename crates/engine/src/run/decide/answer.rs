//! Answers to interrupts: validation against the interrupt's response schema, and what is sent
//! to the kernel for each.
//!
//! Every answer of a resume is validated before any is sent, so a resume is either refused whole
//! or delivered.

use a2a::PermissionDecision;
use serde_json::{json, Value};

use crate::canonical;
use crate::error::{msg, ApiError, Code};
use crate::mapping::interrupt::{self, InterruptKind};
use crate::validate::{ResumeEntry, ResumeStatus};
use store::PendingEntry;

/// Why an answer is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("a resolved interrupt requires a payload")]
    MissingPayload,
    #[error("the payload does not match the interrupt's response schema")]
    InvalidPayload,
    #[error("the answer to a question carries no text")]
    NoAnswer,
}

impl From<AnswerError> for ApiError {
    fn from(e: AnswerError) -> ApiError {
        let m = match e {
            AnswerError::MissingPayload => msg::PAYLOAD_REQUIRED,
            AnswerError::InvalidPayload => msg::PAYLOAD_INVALID,
            AnswerError::NoAnswer => msg::NO_ANSWER,
        };
        ApiError::new(Code::ResumePayloadInvalid, m)
    }
}

/// What the kernel is sent for one answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A permission decision (a cancelled permission is a denial).
    Permission {
        decision: PermissionDecision,
        /// The request's tool use id: a string as it is, another JSON value as its canonical
        /// text, none when the request has none (see [`a2a::PermissionAnswer`] for how that is
        /// sent).
        tool_use_id: Option<String>,
    },
    /// A question's answer text; the question's tool call, if any, gets it as its result.
    Question {
        text: String,
        tool_use_id: Option<String>,
    },
    /// A cancelled question: the execution is cancelled.
    CancelQuestion,
}

/// The digest an applied answer is remembered by: SHA-256 of the canonical JSON of
/// `{"status", "payload"}` (the raw payload, null if absent). The same answer again is
/// recognised; a different one to the same interrupt is a conflict.
pub fn digest(e: &ResumeEntry) -> String {
    canonical::digest_value(
        &json!({"status": e.status.as_str(), "payload": e.payload.clone().unwrap_or(Value::Null)}),
    )
}

/// Validates `e` as the answer to `p` (JSON Schema draft 2020-12) and says what to send.
pub fn validate(e: &ResumeEntry, p: &PendingEntry) -> Result<Answer, AnswerError> {
    let kind = InterruptKind::of(&p.value);
    let payload = match (e.status, kind) {
        (ResumeStatus::Cancelled, InterruptKind::Permission) => json!({"decision": "deny"}),
        (ResumeStatus::Cancelled, InterruptKind::Question) => return Ok(Answer::CancelQuestion),
        (ResumeStatus::Resolved, _) => e.payload.clone().ok_or(AnswerError::MissingPayload)?,
    };
    let schema = interrupt::build(&e.interrupt_id, &p.value, None)
        .response_schema
        .unwrap_or(Value::Bool(true));
    let valid = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .map(|v| v.is_valid(&payload))
        .unwrap_or(false);
    if !valid {
        return Err(AnswerError::InvalidPayload);
    }
    if kind == InterruptKind::Permission {
        // The schema admits only the kernel's decisions.
        let decision = payload
            .get("decision")
            .and_then(Value::as_str)
            .and_then(PermissionDecision::parse)
            .unwrap_or(PermissionDecision::Deny);
        let tool_use_id = match p.value.get("toolUseId") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Null) | None => None,
            Some(v) => Some(canonical::canonical_value(v)),
        };
        return Ok(Answer::Permission {
            decision,
            tool_use_id,
        });
    }
    let text = question_text(&payload, p);
    if text.is_empty() {
        return Err(AnswerError::NoAnswer);
    }
    Ok(Answer::Question {
        text,
        tool_use_id: p
            .value
            .get("toolUseId")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    })
}

/// The text a question's answer sends: free text, else the chosen option's label (or name, or
/// id).
fn question_text(payload: &Value, p: &PendingEntry) -> String {
    if let Some(t) = payload
        .get("freeText")
        .or_else(|| payload.get("free_text"))
        .and_then(Value::as_str)
    {
        return t.to_owned();
    }
    let Some(sel) = payload.get("selectedId").and_then(Value::as_str) else {
        return String::new();
    };
    let options = p.value.get("options").and_then(Value::as_array);
    for o in options.into_iter().flatten() {
        let Some(m) = o.as_object() else { continue };
        let oid = m.get("id").map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        if oid.as_deref() == Some(sel) {
            return ["label", "name"]
                .iter()
                .find_map(|k| m.get(*k).and_then(Value::as_str).filter(|s| !s.is_empty()))
                .unwrap_or(sel)
                .to_owned();
        }
    }
    sel.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Map;

    fn pending(v: Value) -> PendingEntry {
        PendingEntry {
            value: v.as_object().cloned().unwrap_or_else(Map::new),
            sideband: false,
            expires_at: None,
        }
    }

    fn entry(status: ResumeStatus, payload: Option<Value>) -> ResumeEntry {
        ResumeEntry {
            interrupt_id: "i1".into(),
            status,
            payload,
        }
    }

    fn permission() -> PendingEntry {
        pending(json!({"kind": "permission", "inputId": "i1", "toolUseId": "tu-1"}))
    }

    fn question() -> PendingEntry {
        pending(
            json!({"kind": "question", "inputId": "i1", "toolUseId": "tu-2",
            "options": [{"id": "a", "label": "Alpha"}, {"id": 2, "name": "Two"}, {"id": "c"}],
            "allowFreeText": true}),
        )
    }

    #[test]
    fn permissions() {
        let ok = entry(
            ResumeStatus::Resolved,
            Some(json!({"decision": "allow_once"})),
        );
        assert_eq!(
            validate(&ok, &permission()),
            Ok(Answer::Permission {
                decision: PermissionDecision::AllowOnce,
                tool_use_id: Some("tu-1".into())
            })
        );
        let cancelled = entry(ResumeStatus::Cancelled, None);
        assert!(matches!(
            validate(&cancelled, &permission()),
            Ok(Answer::Permission {
                decision: PermissionDecision::Deny,
                ..
            })
        ));
        let bad = entry(ResumeStatus::Resolved, Some(json!({"decision": "always"})));
        assert_eq!(
            validate(&bad, &permission()),
            Err(AnswerError::InvalidPayload)
        );
        let none = entry(ResumeStatus::Resolved, None);
        assert_eq!(
            validate(&none, &permission()),
            Err(AnswerError::MissingPayload)
        );
        // A tool use id that is not a string is sent as the kernel prints it.
        let mut odd = permission();
        odd.value.insert("toolUseId".into(), json!(7));
        assert!(
            matches!(validate(&ok, &odd), Ok(Answer::Permission { tool_use_id, .. }) if tool_use_id.as_deref() == Some("7"))
        );
        for absent in [Some(Value::Null), None] {
            match absent {
                Some(v) => odd.value.insert("toolUseId".into(), v),
                None => odd.value.remove("toolUseId"),
            };
            assert!(matches!(
                validate(&ok, &odd),
                Ok(Answer::Permission {
                    tool_use_id: None,
                    ..
                })
            ));
        }
    }

    #[test]
    fn questions() {
        let text = |payload: Value| match validate(
            &entry(ResumeStatus::Resolved, Some(payload)),
            &question(),
        ) {
            Ok(Answer::Question { text, tool_use_id }) => {
                assert_eq!(tool_use_id.as_deref(), Some("tu-2"));
                Ok(text)
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(text(json!({"selectedId": "a"})), Ok("Alpha".into()));
        assert_eq!(text(json!({"selectedId": "2"})), Ok("Two".into()));
        assert_eq!(text(json!({"selectedId": "c"})), Ok("c".into()));
        assert_eq!(text(json!({"freeText": "my own"})), Ok("my own".into()));
        assert_eq!(
            text(json!({"selectedId": "zz"})),
            Err(AnswerError::InvalidPayload)
        );
        assert_eq!(
            text(json!({"freeText": ""})),
            Err(AnswerError::InvalidPayload)
        );
        assert_eq!(
            validate(&entry(ResumeStatus::Cancelled, None), &question()),
            Ok(Answer::CancelQuestion)
        );
        let e: ApiError = AnswerError::NoAnswer.into();
        assert_eq!(e.code, Code::ResumePayloadInvalid);
    }

    #[test]
    fn digests_tell_answers_apart() {
        let a = entry(
            ResumeStatus::Resolved,
            Some(json!({"decision": "allow_once"})),
        );
        let b = entry(ResumeStatus::Resolved, Some(json!({"decision": "deny"})));
        let null = entry(ResumeStatus::Resolved, Some(Value::Null));
        let absent = entry(ResumeStatus::Resolved, None);
        assert_ne!(digest(&a), digest(&b));
        assert_eq!(
            digest(&null),
            digest(&absent),
            "null and absent are one payload"
        );
        assert_ne!(
            digest(&absent),
            digest(&entry(ResumeStatus::Cancelled, None))
        );
    }

    proptest! {
        /// Any payload to any interrupt: validation never panics, and an accepted question
        /// answer always has text.
        #[test]
        fn validation_is_total(payload in prop::option::of(prop_oneof![
            Just(json!({"decision": "allow_once"})),
            Just(json!({"decision": "deny"})),
            "[a-z]{0,3}".prop_map(|s| json!({"selectedId": s})),
            "[a-z]{0,3}".prop_map(|s| json!({"freeText": s})),
            any::<i64>().prop_map(|n| json!(n)),
        ]), resolved in any::<bool>(), perm in any::<bool>()) {
            let status = if resolved { ResumeStatus::Resolved } else { ResumeStatus::Cancelled };
            let p = if perm { permission() } else { question() };
            match validate(&entry(status, payload), &p) {
                Ok(Answer::Question { text, .. }) => prop_assert!(!text.is_empty()),
                Ok(Answer::Permission { .. }) => prop_assert!(perm),
                Ok(Answer::CancelQuestion) => prop_assert!(!perm && !resolved),
                Err(_) => prop_assert!(resolved),
            }
        }
    }
}
