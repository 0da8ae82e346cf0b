//! The cancellation extension (§14 with D-13: truthful outcomes, 503 instead of bare 500s).

use super::admission::{expire_if_due, mark_terminal};
use super::Runtime;
use crate::error::{msg, ApiError, Code};

/// Result of a cancellation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    Cancelled,
    AlreadyTerminal,
}

impl CancelOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::AlreadyTerminal => "already_terminal",
        }
    }
}

fn not_found() -> ApiError {
    ApiError::new(Code::ExecutionNotFound, msg::EXECUTION_NOT_FOUND)
}

fn state_unavailable() -> ApiError {
    ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
}

/// Cancels `execution_id` of `thread_id`.
pub async fn cancel(
    rt: &Runtime,
    execution_id: &str,
    thread_id: &str,
    ros_invocation_id: &str,
) -> Result<CancelOutcome, ApiError> {
    let slot = rt.threads.slot(thread_id);
    let (task_id, control) = {
        let mut st = slot.state.lock().await;
        rt.threads
            .ensure_loaded(&mut st, thread_id)
            .await
            .map_err(|_| state_unavailable())?;
        let active_control = st
            .active
            .as_ref()
            .filter(|a| a.execution_id == execution_id)
            .map(|a| a.control.clone());
        let Some(doc) = st.doc.as_mut() else {
            return Err(not_found());
        };
        // D-4: expiry on access.
        if active_control.is_none() {
            let before = doc.clone();
            if let Some(task) = expire_if_due(doc, rt.clock.now_ms()) {
                if rt.threads.persist(doc).await.is_err() {
                    *doc = before;
                    return Err(state_unavailable());
                }
                if let (Some(task), Some(c)) = (task, rt.kernel.client()) {
                    tokio::spawn(async move {
                        let _ = c.cancel_task(&task).await;
                    });
                }
            }
        }
        if doc.terminal_execution_ids.contains(execution_id) {
            return Ok(CancelOutcome::AlreadyTerminal);
        }
        if doc.execution.execution_id != execution_id
            || doc.execution.ros_invocation_id != ros_invocation_id
        {
            return Err(not_found());
        }
        // The run learns of the cancellation first, under the thread lock: it ends CANCELLED
        // even when the kernel is slow to confirm (its CancelTask drains for up to 30 s), so the
        // answer below and the run's terminal event always agree.
        if let Some(c) = &active_control {
            c.request_cancel();
        }
        (doc.execution.task_id.clone(), active_control)
    };

    // The kernel call runs without the thread lock (it may take up to 30 s to drain).
    let mut outcome = CancelOutcome::Cancelled;
    if let Some(task) = &task_id {
        let client = rt
            .kernel
            .client()
            .ok_or_else(|| ApiError::new(Code::A2aUnavailable, msg::A2A_UNAVAILABLE))?;
        match client.cancel_task(task).await {
            Ok(_) => {}
            // TASK_NOT_CANCELABLE / TASK_NOT_FOUND: the task is no longer running.
            // The kernel's turn ended just now; a live run still ends CANCELLED (requested above).
            Err(e) if e.is_task_gone() && control.is_none() => {
                outcome = CancelOutcome::AlreadyTerminal;
            }
            Err(e) if e.is_task_gone() => {}
            Err(_) => return Err(ApiError::new(Code::A2aUnavailable, msg::A2A_UNAVAILABLE)),
        }
    }
    if let Some(c) = &control {
        // The run ends with RUN_ERROR CANCELLED; with no task id yet, it cancels the task as soon
        // as the kernel names it.
        c.request_cancel();
    }
    let mut st = slot.state.lock().await;
    let Some(doc) = st.doc.as_mut() else {
        return Err(state_unavailable());
    };
    if doc.execution.execution_id == execution_id
        && !doc.terminal_execution_ids.contains(execution_id)
    {
        let before = doc.clone();
        mark_terminal(doc);
        if rt.threads.persist(doc).await.is_err() {
            *doc = before;
            return Err(state_unavailable());
        }
    }
    Ok(outcome)
}
