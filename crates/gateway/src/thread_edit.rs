//! Changing threads: `PATCH /threads/{threadId}` (its title, whether it is archived) and
//! `DELETE /threads/{threadId}` (its document, transcript and summary). Scoped like every thread
//! route: another user's thread is one that does not exist.
//!
//! A deletion cancels nothing: it is refused while a run holds the thread (`THREAD_BUSY`) and
//! while its kernel task is open, waiting for interrupt answers or left by a run a restart
//! interrupted (`THREAD_EXECUTION_OPEN`): the client cancels that execution first, knowingly.
//! The workspace directory is the user's and stays.

use serde_json::{json, Map, Value};

use crate::auth::access::{self, DELETE_ROUTE, PATCH_ROUTE};
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::threads_api::read_theirs;
use engine::run::hold::check_thread_id;
use engine::run::Runtime;
use store::listing::{self, ThreadPatch, ThreadSummary};

/// The largest `PATCH` body read.
pub const PATCH_BODY_LIMIT: usize = 4 * 1024;

/// Reads a patch (pure): `title` (a string, on one line, 1 to 120 characters, no control
/// characters) and `archived` (a boolean), at least one, nothing else.
pub fn parse_patch(obj: &Map<String, Value>) -> Result<ThreadPatch, ApiError> {
    let bad = || ApiError::new(Code::InvalidInput, msg::BAD_PATCH);
    let mut patch = ThreadPatch::default();
    for (k, v) in obj {
        match (k.as_str(), v) {
            ("title", Value::String(t)) => {
                if t.chars().any(char::is_control) {
                    return Err(bad());
                }
                let t = t.trim();
                let n = t.chars().count();
                if n == 0 || n > listing::MAX_TITLE_CHARS {
                    return Err(bad());
                }
                patch.title = Some(t.to_owned());
            }
            ("archived", Value::Bool(b)) => patch.archived = Some(*b),
            _ => return Err(bad()),
        }
    }
    if patch == ThreadPatch::default() {
        return Err(bad());
    }
    Ok(patch)
}

/// A thread as the list and a patch show it.
pub fn summary_json(t: &ThreadSummary) -> Value {
    json!({
        "threadId": t.thread_id,
        "title": t.title,
        "createdAt": t.created_at,
        "lastActivityAt": t.last_activity_at,
        "archived": t.archived,
        "activeRun": t.active_run.as_ref().map(|r| json!({"runId": r})),
        "pendingInterrupts": t.pending,
    })
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "changing a thread failed");
    ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
}

/// `PATCH /threads/{threadId}` after the checks of the route; the thread as listed after.
pub async fn patch(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
    patch: ThreadPatch,
) -> Result<Value, ApiError> {
    read_theirs(rt, PATCH_ROUTE, caller, thread_id, |_, _| ()).await?;
    let store = rt.threads().store();
    match store.update_thread(thread_id, patch).await {
        Ok(Some(s)) => Ok(summary_json(&s)),
        Ok(None) => Err(ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND)),
        Err(e) => Err(unavailable(e)),
    }
}

/// `DELETE /threads/{threadId}` after the checks of the route, under the thread's lock (no run
/// is admitted meanwhile).
pub async fn delete(rt: &Runtime, caller: &Caller, thread_id: &str) -> Result<Value, ApiError> {
    check_thread_id(thread_id)?;
    let threads = rt.threads();
    let slot = threads.slot(thread_id);
    let mut st = threads.lock(&slot, thread_id).await.map_err(unavailable)?;
    let missing = || ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND);
    let Some(doc) = st.doc() else {
        return Err(missing());
    };
    if !caller.may_touch(doc.owner_or_user()) {
        access::not_theirs(&**rt.metrics(), DELETE_ROUTE, caller, thread_id);
        return Err(missing());
    }
    if st.active().is_some() {
        return Err(ApiError::new(Code::ThreadBusy, msg::THREAD_BUSY));
    }
    let open = ApiError::new(Code::ThreadExecutionOpen, msg::EXECUTION_OPEN);
    if doc.active_run.is_some() || !doc.execution.pending.is_empty() {
        return Err(open);
    }
    // A shared store deletes only a row no run or task holds open (another instance's view).
    if !threads
        .delete(&mut st, thread_id)
        .await
        .map_err(unavailable)?
    {
        return Err(open);
    }
    rt.replays().forget_thread(thread_id);
    tracing::info!(thread_id, user = caller.user.as_deref(), "thread deleted");
    Ok(json!({"threadId": thread_id, "deleted": true}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn patches() {
        assert_eq!(
            parse_patch(&obj(json!({"title": "  VPC work ", "archived": true}))).unwrap(),
            ThreadPatch {
                title: Some("VPC work".into()),
                archived: Some(true)
            }
        );
        assert_eq!(
            parse_patch(&obj(json!({"archived": false})))
                .unwrap()
                .archived,
            Some(false)
        );
        let long = "x".repeat(listing::MAX_TITLE_CHARS + 1);
        for bad in [
            json!({}),
            json!({"title": ""}),
            json!({"title": "  "}),
            json!({"title": "a\nb"}),
            json!({"title": long}),
            json!({"title": 3}),
            json!({"archived": "true"}),
            json!({"archived": null}),
            json!({"title": "ok", "owner": "mallory"}),
        ] {
            assert_eq!(
                parse_patch(&obj(bad.clone())).map_err(|e| e.code),
                Err(Code::InvalidInput),
                "{bad}"
            );
        }
        let max = "é".repeat(listing::MAX_TITLE_CHARS);
        assert!(parse_patch(&obj(json!({ "title": max }))).is_ok());
    }
}
