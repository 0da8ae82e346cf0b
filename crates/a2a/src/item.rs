//! What the kernel answers: stream items and task snapshots, read through one typed view.
//!
//! An item's body stays JSON: its `metadata.iac_code` is the kernel's open-ended extension, and
//! turning it into AG-UI events is the gateway's mapping. What callers decide on (identities,
//! state, the kernel's acknowledgements) is read here, once, by name.

use serde_json::{Map, Value};

use crate::TaskState;

/// A view of one kernel item (a stream `result`, a bare task) after unwrapping.
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

    /// `status.timestamp` (RFC 3339).
    pub fn timestamp(&self) -> Option<&'a str> {
        self.status()
            .and_then(|s| s.get("timestamp"))
            .and_then(Value::as_str)
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

    /// The kernel only acknowledges an answer here: it had it already (`inputReceived` with
    /// `duplicate: true`), or it carries the permission's continuation on another stream
    /// (`permissionAck`). Such a stream does not carry the rest of the turn.
    pub fn is_acknowledgement(&self) -> bool {
        let Some(m) = self.meta() else {
            return false;
        };
        let duplicate = m
            .get("inputReceived")
            .and_then(|r| r.get("duplicate"))
            .and_then(Value::as_bool)
            == Some(true);
        duplicate || m.contains_key("permissionAck")
    }
}

/// A task snapshot (`GetTask`, `CancelTask`, `ListTasks`).
#[derive(Debug, Clone, PartialEq)]
pub struct Task(Value);

impl Task {
    pub fn new(v: Value) -> Task {
        Task(v)
    }

    pub fn view(&self) -> ItemView<'_> {
        ItemView::new(&self.0)
    }

    pub fn id(&self) -> Option<&str> {
        self.view().task_id()
    }

    pub fn state(&self) -> Option<TaskState> {
        self.view().state()
    }

    /// The task as the kernel sent it (for mapping).
    pub fn as_value(&self) -> &Value {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unwraps_and_reads_identities() {
        let r = json!({"statusUpdate":{"taskId":"T","contextId":"C","status":{"state":"TASK_STATE_WORKING"},
            "metadata":{"iac_code":{"iacCodeSessionId":"S"}}}});
        let v = ItemView::new(&r);
        assert_eq!(v.task_id(), Some("T"));
        assert_eq!(v.context_id(), Some("C"));
        assert_eq!(v.state(), Some(TaskState::Working));
        assert_eq!(v.meta().unwrap()["iacCodeSessionId"], "S");
        assert!(!v.is_acknowledgement());

        let bare = Task::new(json!({"id":"T2","contextId":"C",
            "status":{"state":"TASK_STATE_CANCELED","timestamp":"2026-12-01T00:00:00Z"}}));
        assert_eq!(bare.id(), Some("T2"));
        assert_eq!(bare.state(), Some(TaskState::Canceled));
        assert_eq!(bare.view().timestamp(), Some("2026-12-01T00:00:00Z"));
        assert!(bare.view().meta().is_none());
    }

    #[test]
    fn acknowledgements() {
        for meta in [
            json!({"inputReceived": {"duplicate": true}}),
            json!({"permissionAck": {}}),
        ] {
            let r = json!({"statusUpdate": {"taskId": "T", "metadata": {"iac_code": meta}}});
            assert!(ItemView::new(&r).is_acknowledgement());
        }
        let r = json!({"statusUpdate": {"metadata": {"iac_code": {"inputReceived": {"duplicate": false}}}}});
        assert!(!ItemView::new(&r).is_acknowledgement());
    }
}
