//! Thread documents for the decisions' tests.

use crate::clock::rfc3339_ms;
use crate::store::{Execution, PendingEntry, ThreadDoc};

/// The time the tests decide at.
pub const NOW: i64 = 1_780_000_000_000;

/// A thread (`thread-1`, bound to `/w`, execution `exec-0` of `inv-1` on `task-1`) waiting for
/// the given interrupts, each with an optional expiry instant (ms).
pub fn doc_with_pending(pending: &[(&str, Option<i64>)]) -> ThreadDoc {
    ThreadDoc {
        thread_id: "thread-1".into(),
        context_id: crate::run::decide::admission::context_id("thread-1"),
        cwd: "/w".into(),
        user_id: None,
        session_id: Some("session-1".into()),
        execution: Execution {
            execution_id: "exec-0".into(),
            ros_invocation_id: "inv-1".into(),
            task_id: Some("task-1".into()),
            pipeline_sequence: 0,
            pipeline_open_steps: Default::default(),
            text_snapshot_digests: Default::default(),
            pending: pending
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
                .collect(),
        },
        run_digests: Default::default(),
        applied_resume_digests: Default::default(),
        terminal_execution_ids: Default::default(),
        expired_interrupts: Default::default(),
        delivering: Default::default(),
        active_run: None,
        last_run: None,
    }
}
