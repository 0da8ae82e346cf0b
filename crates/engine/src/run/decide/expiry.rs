//! Interrupt expiry: an interrupt older than its `expiresAt` is no longer answerable.
//!
//! Expiry is checked on every access to a thread (admission, cancel) rather than by a timer, so
//! a gateway that was down when an interrupt expired still honours it. The expired ids are
//! remembered with their execution: every later answer to them gets `EXECUTION_EXPIRED`, never a
//! vaguer "unknown" or "lost".

use clock::parse_rfc3339_ms;
use store::ThreadDoc;

/// What expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The kernel task that waited for the answers (cancel it, best effort).
    pub task: Option<String>,
    /// The key of the kernel the thread is on (`ThreadDoc::kernel`): where to cancel it.
    pub kernel: Option<String>,
}

/// If a pending interrupt of the current execution has expired at `now_ms`: clears the pending
/// state, remembers the expired ids and ends the execution.
pub fn expire_if_due(doc: &mut ThreadDoc, now_ms: i64) -> Option<Expired> {
    let expired = doc.execution.pending.iter().any(|(_, e)| {
        e.expires_at
            .as_deref()
            .and_then(parse_rfc3339_ms)
            .is_some_and(|t| t <= now_ms)
    });
    if !expired {
        return None;
    }
    let exec = doc.execution.execution_id.clone();
    for (id, _) in &doc.execution.pending {
        doc.expired_interrupts.insert((exec.clone(), id.clone()));
    }
    let task = doc.execution.task_id.clone();
    doc.end_execution();
    Some(Expired {
        task,
        kernel: doc.kernel.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::decide::testing::{doc_with_pending, NOW};

    #[test]
    fn only_a_due_interrupt_expires_and_it_takes_the_execution_with_it() {
        let mut doc = doc_with_pending(&[("a", Some(NOW + 1)), ("b", None)]);
        assert_eq!(expire_if_due(&mut doc, NOW), None);
        assert_eq!(doc.execution.pending.len(), 2);

        let mut doc = doc_with_pending(&[("a", Some(NOW)), ("b", None)]);
        let exec = doc.execution.execution_id.clone();
        let expired = expire_if_due(&mut doc, NOW).unwrap();
        assert_eq!(expired.task.as_deref(), Some("task-1"));
        assert!(doc.execution.pending.is_empty());
        assert!(doc.execution.task_id.is_none());
        assert!(doc.terminal_execution_ids.contains(&exec));
        // Every pending id is remembered, the undated one too: they were one question set.
        assert!(doc.expired_interrupts.contains(&(exec.clone(), "a".into())));
        assert!(doc.expired_interrupts.contains(&(exec, "b".into())));
        assert_eq!(expire_if_due(&mut doc, NOW + 10), None, "once");
    }
}
