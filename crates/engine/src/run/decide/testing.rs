//! Thread documents for the decisions' tests.

use clock::rfc3339_ms;
use store::{Execution, PendingEntry, ThreadDoc};

/// The time the tests decide at.
pub const NOW: i64 = 1_780_000_000_000;

/// A thread (`thread-1`, bound to `/w`, execution `exec-0` of `inv-1` on `task-1`) waiting for
/// the given interrupts, each with an optional expiry instant (ms).
pub fn doc_with_pending(pending: &[(&str, Option<i64>)]) -> ThreadDoc {
    let mut execution = Execution::new("exec-0", "inv-1");
    execution.task_id = Some("task-1".into());
    execution.pending = pending
        .iter()
        .map(|(id, expires)| {
            let value = serde_json::json!({"kind": "permission", "inputId": id, "toolUseId": format!("tool-{id}")});
            (
                (*id).to_owned(),
                PendingEntry {
                    value: value.as_object().cloned().unwrap_or_default(),
                    sideband: false,
                    expires_at: expires.map(rfc3339_ms),
                },
            )
        })
        .collect();
    let context_id = crate::run::decide::admission::context_id("thread-1");
    let mut doc = ThreadDoc::new("thread-1", context_id, "/w", None, execution);
    doc.session_id = Some("session-1".into());
    doc
}
