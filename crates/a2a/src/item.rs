//! Interpretation of kernel items: unwrapping of `StreamResponse`s, identities and task state.

use serde_json::{Map, Value};

/// A normalised A2A task state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
    AuthRequired,
    Other(String),
}

impl TaskState {
    /// Normalises a wire state: lower-case, `task_state_` prefix removed, `_` → `-`
    /// (`TASK_STATE_INPUT_REQUIRED` → `input-required`).
    pub fn parse(raw: &str) -> TaskState {
        let lower = raw.to_ascii_lowercase();
        let s = lower
            .strip_prefix("task_state_")
            .unwrap_or(&lower)
            .replace('_', "-");
        match s.as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "input-required" => TaskState::InputRequired,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" | "cancelled" => TaskState::Canceled,
            "rejected" => TaskState::Rejected,
            "auth-required" => TaskState::AuthRequired,
            _ => TaskState::Other(s),
        }
    }

    /// States after which the gateway stops reading a stream (input-required is decided by the
    /// caller, depending on whether new inputs are pending).
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            TaskState::Completed
                | TaskState::Failed
                | TaskState::Canceled
                | TaskState::Rejected
                | TaskState::AuthRequired
        )
    }
}

/// A view of one kernel item (a JSON-RPC `result`, a bare Task, …) after unwrapping.
#[derive(Debug, Clone, Copy)]
pub struct ItemView<'a> {
    /// The unwrapped object: `task`, `statusUpdate`, `artifactUpdate` or `message` when present.
    pub obj: &'a Value,
}

impl<'a> ItemView<'a> {
    /// Unwraps a `result` object: the first object among `task`, `statusUpdate`, `artifactUpdate`,
    /// `message`; otherwise the object itself.
    pub fn new(result: &'a Value) -> ItemView<'a> {
        for key in ["task", "statusUpdate", "artifactUpdate", "message"] {
            if let Some(v) = result.get(key).filter(|v| v.is_object()) {
                return ItemView { obj: v };
            }
        }
        ItemView { obj: result }
    }

    fn str_field(&self, key: &str) -> Option<&'a str> {
        self.obj
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    }

    /// `taskId`, else `id`.
    pub fn task_id(&self) -> Option<&'a str> {
        self.str_field("taskId").or_else(|| self.str_field("id"))
    }

    pub fn context_id(&self) -> Option<&'a str> {
        self.str_field("contextId")
    }

    pub fn status(&self) -> Option<&'a Value> {
        self.obj.get("status").filter(|v| v.is_object())
    }

    pub fn state(&self) -> Option<TaskState> {
        self.status()
            .and_then(|s| s.get("state"))
            .and_then(Value::as_str)
            .map(TaskState::parse)
    }

    /// `metadata.iac_code`, when it is an object.
    pub fn meta(&self) -> Option<&'a Map<String, Value>> {
        self.obj
            .get("metadata")
            .and_then(|m| m.get("iac_code"))
            .and_then(Value::as_object)
    }

    /// The artifact of an `artifactUpdate`.
    pub fn artifact(&self) -> Option<&'a Map<String, Value>> {
        self.obj.get("artifact").and_then(Value::as_object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn states_normalise() {
        assert_eq!(
            TaskState::parse("TASK_STATE_INPUT_REQUIRED"),
            TaskState::InputRequired
        );
        assert_eq!(TaskState::parse("working"), TaskState::Working);
        assert_eq!(
            TaskState::parse("TASK_STATE_AUTH_REQUIRED"),
            TaskState::AuthRequired
        );
        assert_eq!(
            TaskState::parse("TASK_STATE_UNSPECIFIED"),
            TaskState::Other("unspecified".into())
        );
        assert!(TaskState::Failed.is_final());
        assert!(!TaskState::InputRequired.is_final());
    }

    #[test]
    fn unwraps_and_reads_identities() {
        let r = json!({"statusUpdate":{"taskId":"T","contextId":"C","status":{"state":"TASK_STATE_WORKING"},
            "metadata":{"iac_code":{"iacCodeSessionId":"S"}}}});
        let v = ItemView::new(&r);
        assert_eq!(v.task_id(), Some("T"));
        assert_eq!(v.context_id(), Some("C"));
        assert_eq!(v.state(), Some(TaskState::Working));
        assert_eq!(v.meta().unwrap()["iacCodeSessionId"], "S");

        let bare = json!({"id":"T2","contextId":"C","status":{"state":"TASK_STATE_CANCELED"}});
        let v = ItemView::new(&bare);
        assert_eq!(v.task_id(), Some("T2"));
        assert_eq!(v.state(), Some(TaskState::Canceled));
        assert!(v.meta().is_none());
    }
}
