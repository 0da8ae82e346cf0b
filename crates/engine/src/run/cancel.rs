//! The cancellation extension: `POST /extensions/iac-code/v1/executions/{id}/cancel`.
//!
//! The answer is truthful: `cancelled` only when the kernel accepted the cancel (or the task is
//! not known yet and the run was stopped: it cancels the task as soon as the kernel names it);
//! `already_terminal` when the execution had ended or the kernel says the task is past
//! cancelling. A kernel that cannot be reached is 503 `A2A_UNAVAILABLE`, state that cannot be
//! read or saved 503 `STATE_UNAVAILABLE`.

use super::decide::expiry::expire_if_due;
use super::hold::ThreadHold;
use super::Runtime;
use crate::caller::Caller;
use crate::caller::{self as access, CANCEL_ROUTE};
use crate::error::{msg, ApiError, Code};

/// Result of a cancellation request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CancelOutcome {
    Cancelled,
    AlreadyTerminal,
}

impl CancelOutcome {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

pub fn not_found() -> ApiError {
    ApiError::new(Code::ExecutionNotFound, msg::EXECUTION_NOT_FOUND)
}

fn state_unavailable() -> ApiError {
    ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
}

/// The ids of a cancellation, checked before anything (a store, a forward) sees them: an
/// execution id no execution can have is not found; a thread or invocation id beyond the bound
/// of ids (see [`crate::bounded::is_bounded`]) is invalid input.
pub fn check_ids(
    execution_id: &str,
    thread_id: &str,
    ros_invocation_id: &str,
) -> Result<(), ApiError> {
    use crate::bounded::is_bounded;
    if !is_bounded(execution_id) {
        return Err(not_found());
    }
    if !is_bounded(thread_id) {
        return Err(ApiError::new(Code::InvalidInput, msg::ID_THREAD));
    }
    if !is_bounded(ros_invocation_id) {
        return Err(ApiError::new(Code::InvalidInput, msg::ID_INVOCATION));
    }
    Ok(())
}

/// Cancels `execution_id` of `thread_id`.
pub async fn cancel(
    rt: &Runtime,
    caller: &Caller,
    execution_id: &str,
    thread_id: &str,
    ros_invocation_id: &str,
) -> Result<CancelOutcome, ApiError> {
    let threads = rt.threads();
    // Another user's thread is, to this caller, one that does not exist: checked before the
    // claim, which may take a thread over (a write); nothing expires, nothing is cancelled.
    if !super::hold::may_touch(threads, caller, thread_id).await? {
        access::not_theirs(&**rt.metrics(), CANCEL_ROUTE, caller, thread_id);
        return Err(not_found());
    }
    let slot = threads.slot(thread_id);
    let (task_id, control, hold, kernel) = {
        // A shared store hands the thread to this instance first (its holder dead), or says
        // another holds it (the route forwarded there already: it moved just now).
        let (mut st, holder) = threads
            .claim(&slot, thread_id)
            .await
            .map_err(|_| state_unavailable())?;
        if let super::Holder::Elsewhere(_) = holder {
            return Err(ApiError::new(
                Code::StateUnavailable,
                msg::HOLDER_UNREACHABLE,
            ));
        }
        let control = st
            .active()
            .filter(|a| a.execution_id == execution_id)
            .map(|a| a.control.clone());
        let Some(doc) = st.doc() else {
            return Err(not_found());
        };
        // Another user's thread is, to this caller, one that does not exist: nothing expires,
        // nothing is cancelled.
        if !caller.may_touch(doc.owner_or_user()) {
            access::not_theirs(&**rt.metrics(), CANCEL_ROUTE, caller, thread_id);
            return Err(not_found());
        }
        // Interrupts expire on any access to their thread (a run holding it owns its state).
        if control.is_none() {
            let mut next = doc.clone();
            if let Some(expired) = expire_if_due(&mut next, rt.now_ms()) {
                threads
                    .store_doc(&mut st, next)
                    .await
                    .map_err(|_| state_unavailable())?;
                rt.cancel_task_later(expired.kernel.as_deref(), expired.task);
            }
        }
        let doc = st.doc().ok_or_else(not_found)?;
        if doc.is_terminal(execution_id) {
            return Ok(CancelOutcome::AlreadyTerminal);
        }
        if !doc.is_current(execution_id) || doc.execution.ros_invocation_id != ros_invocation_id {
            return Err(not_found());
        }
        // The run learns of the cancellation first, under the thread lock: it ends CANCELLED
        // even when the kernel is slow to confirm (its CancelTask drains for up to 30 s), so this
        // answer and the run's terminal event always agree.
        if let Some(c) = &control {
            c.request_cancel();
        }
        let hold = ThreadHold::new(
            rt.threads_arc().clone(),
            slot.clone(),
            st.hold(),
            execution_id.to_owned(),
            // The cancellation's own writes; no run of this instance's lease is watched.
            None,
        );
        let kernel = rt.kernels().of_thread(doc.kernel.as_deref());
        (doc.execution.task_id.clone(), control, hold, kernel)
    };

    // The kernel call runs without the thread lock (it may take up to 30 s to drain).
    let mut outcome = CancelOutcome::Cancelled;
    // A user's kernel stopped for idleness ran nothing of the thread's since: nothing to ask.
    if let (Some(task), Some(kernel)) = (&task_id, kernel) {
        let client = kernel
            .client()
            .ok_or_else(|| ApiError::new(Code::A2aUnavailable, msg::A2A_UNAVAILABLE))?;
        match client.cancel_task(task).await {
            Ok(_) => {}
            // The task is past cancelling: the turn ended just now. A live run still ends
            // CANCELLED (it was asked above), so only a thread without one is already terminal.
            Err(e) if e.is_task_gone() => {
                if control.is_none() {
                    outcome = CancelOutcome::AlreadyTerminal;
                }
            }
            Err(_) => return Err(ApiError::new(Code::A2aUnavailable, msg::A2A_UNAVAILABLE)),
        }
    }
    hold.end_execution_durably(thread_id)
        .await
        .map_err(|_| state_unavailable())?;
    Ok(outcome)
}
