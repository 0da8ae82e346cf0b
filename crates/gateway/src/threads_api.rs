//! Reading runs and threads back: `GET /threads/{threadId}/runs/{runId}/events` (re-attach to a
//! run, with `--detach-grace`) and `GET /threads/{threadId}` (a thread's state, for a reloaded
//! page). Both authenticate like the POST routes, and a caller with a user reaches only that
//! user's threads: another's is, to them, a thread that does not exist.
//!
//! The events route resumes after the id in `Last-Event-ID` (what `EventSource` sends when it
//! reconnects) or `?after=<n>`: it replays the buffered frames after it, then follows the run
//! live until its terminal event. Joined to what the client saw before, that is the run's exact
//! sequence. A reader never slows the run: one that falls behind the buffer is disconnected, and
//! its next request gets `RUN_EVENTS_GONE`; one that reads nothing for the stall timeout is
//! dropped, and no longer holds the run attached.

use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::auth::access::{self, EVENTS_ROUTE, THREAD_ROUTE};
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::telemetry::Limit;
use clock::rfc3339_ms;
use engine::mapping::interrupt;
use engine::run::hold::read_thread;
use engine::run::replay::{Attached, Batch, RunEvents};
use engine::run::{sink, Runtime, ThreadState};
use store::ThreadDoc;

/// A `Last-Event-ID` or `after` that is not an event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadEventId;

/// Where a reader resumes: the `Last-Event-ID` header, else `?after=`, else the start (0). An
/// empty header is the start too (what `EventSource` sends before it saw an id).
pub fn resume_point(headers: &HeaderMap, query: Option<&str>) -> Result<u64, BadEventId> {
    let parse = |s: &str| -> Result<u64, BadEventId> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(0);
        }
        if !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 19 {
            return Err(BadEventId);
        }
        s.parse().map_err(|_| BadEventId)
    };
    if let Some(v) = headers.get("last-event-id") {
        return parse(v.to_str().map_err(|_| BadEventId)?);
    }
    let after = query
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "after");
    match after {
        Some((_, "")) => Err(BadEventId),
        Some((_, v)) => parse(v),
        None => Ok(0),
    }
}

/// What a request for a run's events gets, decided from the buffer (pure).
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Replay `Batch`, then follow the run.
    Stream(Batch),
    /// The run ended and the reader has seen all of it: nothing to send (`EventSource` stops on
    /// a 204 instead of reconnecting for ever).
    Done,
    /// Some of the events after the cursor were dropped.
    Gone,
    /// The cursor is past the run's last event.
    Beyond,
}

pub fn plan(events: &RunEvents, after: u64) -> Plan {
    if after > events.last_id() {
        return Plan::Beyond;
    }
    match events.read_after(after) {
        Err(_) => Plan::Gone,
        Ok(b) if b.complete && b.frames.is_empty() => Plan::Done,
        Ok(b) => Plan::Stream(b),
    }
}

pub(crate) fn sse(rx: mpsc::Receiver<Bytes>, heartbeat: std::time::Duration) -> Response {
    let body = axum::body::Body::from_stream(sink::body_stream(rx, heartbeat));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(body)
        .expect("response builds")
}

/// Replays `first`, then follows `events` until the run ends, the reader leaves, falls behind or
/// reads nothing for `stall`.
fn follow(
    events: Arc<RunEvents>,
    attached: Attached,
    first: Batch,
    capacity: usize,
    heartbeat: std::time::Duration,
    stall: std::time::Duration,
) -> Response {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    tokio::spawn(async move {
        let _attached = attached;
        let mut batch = first;
        loop {
            for f in std::mem::take(&mut batch.frames) {
                // A reader that stalls lets go of the run (and its buffer) like one that left.
                if sink::deliver(&tx, f, stall, None).await != sink::Delivery::Sent {
                    return;
                }
            }
            if batch.complete {
                return;
            }
            let cursor = batch.cursor;
            tokio::select! {
                _ = events.changed_after(cursor) => {}
                _ = tx.closed() => return,
            }
            batch = match events.read_after(cursor) {
                Ok(b) => b,
                // Fell behind the buffer: the client reconnects and is told the events are gone.
                Err(_) => return,
            };
        }
    });
    sse(rx, heartbeat)
}

/// `GET /threads/{threadId}/runs/{runId}/events` after the checks of the route (method, token).
pub async fn events(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
    run_id: &str,
    after: u64,
    heartbeat: std::time::Duration,
) -> Result<Response, ApiError> {
    // Whose the thread is first: a stranger learns nothing of its runs.
    let existed = read_theirs(rt, EVENTS_ROUTE, caller, thread_id, |_, doc| {
        doc.run_digests.contains_key(run_id)
    })
    .await?;
    // A run id beyond the ids' bound is one no run has (a thread's ids are bounded alike).
    if !engine::bounded::is_bounded(run_id) {
        return Err(ApiError::new(Code::RunNotFound, msg::RUN_NOT_FOUND));
    }
    let Some(events) = rt.replays().get(caller, thread_id, run_id) else {
        // Not buffered: say whether the run ever existed.
        return Err(if existed {
            ApiError::new(Code::RunEventsGone, msg::RUN_EVENTS_GONE)
        } else {
            ApiError::new(Code::RunNotFound, msg::RUN_NOT_FOUND)
        });
    };
    match plan(&events, after) {
        Plan::Stream(first) => {
            // A reader costs a task, a channel and a connection for as long as the run lasts:
            // at most `--max-readers-per-run` of them follow one run at once.
            let max = rt.limits().readers_per_run();
            let Some(attached) = events.attach_reader(max) else {
                rt.limits().reached(Limit::Readers);
                return Err(ApiError::new(Code::TooManyReaders, msg::TOO_MANY_READERS));
            };
            Ok(follow(
                events,
                attached,
                first,
                rt.channel_capacity(),
                heartbeat,
                rt.settings().client_stall_timeout,
            ))
        }
        Plan::Done => Ok(StatusCode::NO_CONTENT.into_response()),
        Plan::Gone => Err(ApiError::new(Code::RunEventsGone, msg::RUN_EVENTS_GONE)),
        Plan::Beyond => Err(ApiError::new(Code::InvalidInput, msg::BAD_LAST_EVENT_ID)),
    }
}

/// `GET /threads/{threadId}`: the binding, the active run, the pending interrupts (as the run
/// ended with them) and how the last run ended. Never a secret: the document holds none.
/// On a shared store it also says which instance holds the thread (`heldBy`: the live holder's
/// id, `null` when none does); a request for it was sent to that holder, so it is usually this one.
pub async fn thread(rt: &Runtime, caller: &Caller, thread_id: &str) -> Result<Value, ApiError> {
    let mut v = read_theirs(rt, THREAD_ROUTE, caller, thread_id, |st, doc| {
        describe(rt, caller, thread_id, st, doc)
    })
    .await?;
    let store = rt.threads().store();
    if store.shared() {
        let held_by = store
            .held_by(thread_id)
            .await
            .map_err(|_| ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE))?;
        v["heldBy"] = json!(held_by);
    }
    Ok(v)
}

/// Reads a thread `caller` may touch; another user's is `THREAD_NOT_FOUND`, as a missing one
/// (the refusal recorded).
pub(crate) async fn read_theirs<R>(
    rt: &Runtime,
    route: &'static str,
    caller: &Caller,
    thread_id: &str,
    read: impl FnOnce(&ThreadState, &ThreadDoc) -> R,
) -> Result<R, ApiError> {
    let theirs = read_thread(rt.threads(), thread_id, |st, doc| {
        caller.may_touch(doc.owner_or_user()).then(|| read(st, doc))
    })
    .await?;
    theirs.ok_or_else(|| {
        access::not_theirs(&**rt.metrics(), route, caller, thread_id);
        ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND)
    })
}

/// The answer of `GET /threads/{threadId}` for a thread's state and document.
fn describe(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
    st: &ThreadState,
    doc: &ThreadDoc,
) -> Value {
    let active = running(st, doc).map(|a| {
        let detached = rt
            .replays()
            .get(caller, thread_id, &a.run_id)
            .is_some_and(|e| e.is_detached());
        json!({"runId": a.run_id, "state": if detached { "detached" } else { "running" },
               "since": rfc3339_ms(a.since_ms)})
    });
    // A run recorded as holding the thread that no run of this process holds was lost with the
    // process that ran it (a restart or a crash): its kernel task is cancelled before the next
    // turn, as always.
    let last = match (&doc.active_run, st.active()) {
        (Some(lost), None) => json!({"runId": lost.run_id, "outcome": "lost", "since": lost.since}),
        // As stored: runId, outcome, endedAt and the code of an error.
        _ => json!(doc.last_run),
    };
    let pending: Vec<agui::Interrupt> = doc
        .execution
        .pending
        .iter()
        .map(|(id, e)| interrupt::build(id, &e.value, e.expires_at.as_deref()))
        .collect();
    json!({
        "threadId": doc.thread_id,
        "binding": {"cwd": doc.cwd, "userId": doc.user_id},
        "activeRun": active,
        "pendingInterrupts": pending,
        "lastRun": last,
    })
}

/// The run that holds the thread and has not ended. A run's end is written (its document no
/// longer names it as active, `lastRun` says how it ended) a moment before it frees the thread,
/// while its client takes the terminal event: from that write on it is the last run, not the
/// active one, as the thread list has it.
fn running<'a>(st: &'a ThreadState, doc: &ThreadDoc) -> Option<&'a engine::run::ActiveRun> {
    st.active().filter(|a| {
        doc.active_run
            .as_ref()
            .is_some_and(|mark| mark.run_id == a.run_id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use std::time::Duration;

    fn headers(last: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = last {
            h.insert("last-event-id", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn the_resume_point_comes_from_last_event_id_then_after() {
        assert_eq!(resume_point(&headers(None), None), Ok(0));
        assert_eq!(resume_point(&headers(Some("12")), Some("after=3")), Ok(12));
        assert_eq!(resume_point(&headers(Some("")), None), Ok(0));
        assert_eq!(resume_point(&headers(None), Some("x=1&after=7")), Ok(7));
        for bad in ["-1", "1.5", "abc", "12a", "99999999999999999999"] {
            assert_eq!(
                resume_point(&headers(Some(bad)), None),
                Err(BadEventId),
                "{bad}"
            );
            assert_eq!(
                resume_point(&headers(None), Some(&format!("after={bad}"))),
                Err(BadEventId),
                "{bad}"
            );
        }
        assert_eq!(
            resume_point(&headers(None), Some("after=")),
            Err(BadEventId)
        );
    }

    #[test]
    fn the_plan_of_a_request_for_events() {
        let f = |id: u64| Bytes::from(format!("id: {id}\ndata: {{}}\n\n"));
        let ev = RunEvents::new(f(1).len() * 2, Duration::from_secs(5));
        assert!(matches!(plan(&ev, 0), Plan::Stream(ref b) if b.frames.is_empty()));
        assert_eq!(plan(&ev, 1), Plan::Beyond);
        for id in 1..=3 {
            ev.append(id, f(id), id == 3);
        }
        assert_eq!(plan(&ev, 0), Plan::Gone);
        assert!(
            matches!(plan(&ev, 1), Plan::Stream(ref b) if b.frames == vec![f(2), f(3)] && b.complete)
        );
        assert_eq!(plan(&ev, 3), Plan::Done);
        assert_eq!(plan(&ev, 4), Plan::Beyond);
    }

    #[test]
    fn a_run_whose_end_is_written_is_the_last_run_not_the_active_one() {
        use engine::run::{ActiveRun, RunControl};
        use store::{Execution, LastRun, RunMark};
        let mut doc = ThreadDoc::new("t", "ctx", "/w", None, Execution::new("e", "inv"));
        let mut st = ThreadState::default();
        st.set_active(Some(ActiveRun {
            run_id: "r2".into(),
            since_ms: 0,
            execution_id: "e".into(),
            control: Arc::new(RunControl::default()),
        }));
        // Admitted: the document names it.
        doc.active_run = Some(RunMark {
            run_id: "r2".into(),
            since: "2026-12-04T00:00:00.000Z".into(),
        });
        assert_eq!(running(&st, &doc).map(|a| a.run_id.as_str()), Some("r2"));
        // A run that reuses the last run's id is still running until its own end.
        doc.last_run = Some(LastRun {
            run_id: "r2".into(),
            outcome: crate::telemetry::RunOutcome::Success.into(),
            ended_at: "2026-12-04T00:00:01.000Z".into(),
            code: None,
        });
        assert!(running(&st, &doc).is_some());
        // Its end written, the thread not yet free: ended.
        doc.active_run = None;
        assert!(running(&st, &doc).is_none());
        // Nothing holds the thread.
        st.set_active(None);
        doc.active_run = Some(RunMark {
            run_id: "r3".into(),
            since: "2026-12-04T00:00:02.000Z".into(),
        });
        assert!(running(&st, &doc).is_none());
    }
}
