//! `GET /threads/{threadId}/connect`: everything a reloaded page needs, as one AG-UI stream.
//!
//! 1. A run of its own that restores the thread: `RUN_STARTED` (run id `connect-<uuid>`),
//!    `MESSAGES_SNAPSHOT` (the transcript's newest 1,000 messages, `history::newest_messages`),
//!    `RUN_FINISHED`: with the `interrupt` outcome and the pending interrupts when the thread waits
//!    for answers (as a run that stopped at them ends), else `success`. These events carry no id.
//! 2. The thread's running run, if its events are buffered (`--detach-grace`), from its start:
//!    each event with the id `<runId>:<n>` (`n` its id within the run).
//! 3. With `?follow=true`, each later run of the thread as it starts, the same way; the stream
//!    stays open (heartbeats) until the client leaves.
//!
//! A client that reconnects sends the last id it saw as `Last-Event-ID`: while that run's events
//! after it are buffered the stream continues after it (no snapshot again); once they are not,
//! the stream starts over with a snapshot, which holds that run's messages by then (or will once
//! it ends: a running run whose first events are no longer buffered is not followed). A run that
//! `--max-readers-per-run` readers follow already refuses the connect (429) when it is the one to
//! follow first, and is passed over when it starts later. The dialect is the client's
//! (`?protocolVersion=1.0`; none: the protocol before 1.0), for the snapshot run; a run's own
//! events are as its run sent them. Scoped like every thread route.

use std::sync::Arc;
use std::time::Duration;

use agui::{Dialect, Event, Outcome};
use axum::http::HeaderMap;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};

use crate::auth::access::CONNECT_ROUTE;
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::threads_api::{read_theirs, sse};
use engine::mapping::interrupt;
use engine::run::replay::{Attached, RunEvents};
use engine::run::terminal::Terminal;
use engine::run::{sink, Runtime};

/// What a connect asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectQuery {
    pub follow: bool,
    pub dialect: Dialect,
    /// `Last-Event-ID`: the run and the id within it the client saw last.
    pub resume: Option<(String, u64)>,
}

/// Reads `follow`, `protocolVersion` and `Last-Event-ID` (pure).
pub fn connect_query(headers: &HeaderMap, query: Option<&str>) -> Result<ConnectQuery, ApiError> {
    let mut q = ConnectQuery {
        follow: false,
        dialect: Dialect::Legacy,
        resume: None,
    };
    let (mut follow, mut version) = (None, None);
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let slot = match &*k {
            "follow" => &mut follow,
            "protocolVersion" => &mut version,
            _ => continue,
        };
        if slot.is_some() {
            return Err(ApiError::new(Code::InvalidInput, msg::BAD_CONNECT));
        }
        *slot = Some(v.into_owned());
    }
    q.follow = match follow.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::new(Code::InvalidInput, msg::BAD_CONNECT)),
    };
    if let Some(v) = version {
        q.dialect = Dialect::negotiate(Some(&Value::String(v)))
            .ok_or_else(|| ApiError::new(Code::InvalidInput, msg::UNSUPPORTED_PROTOCOL))?;
    }
    if let Some(v) = headers.get("last-event-id") {
        let bad = || ApiError::new(Code::InvalidInput, msg::BAD_CONNECT_EVENT_ID);
        let v = v.to_str().map_err(|_| bad())?.trim();
        if !v.is_empty() {
            let (run, n) = v.rsplit_once(':').ok_or_else(bad)?;
            if run.is_empty() || engine::run::hold::check_thread_id(run).is_err() {
                return Err(bad());
            }
            if n.is_empty() || n.len() > 19 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            q.resume = Some((run.to_owned(), n.parse().map_err(|_| bad())?));
        }
    }
    Ok(q)
}

/// A buffered frame (`id: <n>\n…`) with the connect stream's id (`id: <runId>:<n>\n…`).
pub fn relabel(frame: &[u8], run_id: &str) -> Bytes {
    match frame.strip_prefix(b"id: ") {
        Some(rest) => {
            let mut out = Vec::with_capacity(frame.len() + run_id.len() + 1);
            out.extend_from_slice(b"id: ");
            out.extend_from_slice(run_id.as_bytes());
            out.push(b':');
            out.extend_from_slice(rest);
            Bytes::from(out)
        }
        None => Bytes::copy_from_slice(frame),
    }
}

/// The snapshot run's frames (pure).
pub fn snapshot_frames(
    thread_id: &str,
    run_id: &str,
    dialect: Dialect,
    messages: Vec<Value>,
    pending: Vec<agui::Interrupt>,
    now_ms: i64,
) -> Vec<Bytes> {
    let outcome = if pending.is_empty() {
        Outcome::Success
    } else {
        Outcome::Interrupt(pending)
    };
    let events = [
        Event::RunStarted {
            thread_id: thread_id.to_owned(),
            run_id: run_id.to_owned(),
            parent_run_id: None,
            protocol_version: (dialect == Dialect::V1).then_some(agui::PROTOCOL_VERSION),
        },
        Event::MessagesSnapshot { messages },
        Terminal {
            thread_id,
            run_id,
            usage: None,
        }
        .finished(outcome),
    ];
    events
        .iter()
        .map(|e| {
            let mut out = Vec::new();
            e.encode_sse(now_ms, &mut out);
            Bytes::from(out)
        })
        .collect()
}

/// Where the stream starts, as the thread stands.
struct Start {
    /// The snapshot, unless the client resumes within a buffered run.
    snapshot: Option<Vec<Bytes>>,
    /// The run to follow first, its reader's place, and the id after which to start.
    run: Option<(String, Arc<RunEvents>, Attached, u64)>,
}

/// `GET /threads/{threadId}/connect` after the checks of the route (method, token, thread id).
pub async fn connect(
    rt: &Arc<Runtime>,
    caller: &Caller,
    thread_id: &str,
    q: ConnectQuery,
    heartbeat: Duration,
) -> Result<Response, ApiError> {
    // Listening before looking: a run that starts meanwhile is not missed.
    let starts = q.follow.then(|| rt.replays().starts());
    let (active, pending) = read_theirs(rt, CONNECT_ROUTE, caller, thread_id, |st, doc| {
        let active = st.active().map(|a| a.run_id.clone());
        let pending: Vec<agui::Interrupt> = doc
            .execution
            .pending
            .iter()
            .map(|(id, e)| interrupt::build(id, &e.value, e.expires_at.as_deref()))
            .collect();
        (active, pending)
    })
    .await?;
    let resumed = q
        .resume
        .as_ref()
        .and_then(|(run, n)| Some((run.clone(), rt.replays().get(caller, thread_id, run)?, *n)))
        .filter(|(_, events, n)| *n <= events.last_id() && events.has_after(*n));
    let readers = rt.limits().readers_per_run();
    let reader = |events: &Arc<RunEvents>| {
        events.attach_reader(readers).ok_or_else(|| {
            rt.limits().reached(crate::telemetry::Limit::Readers);
            ApiError::new(Code::TooManyReaders, msg::TOO_MANY_READERS)
        })
    };
    let start = match resumed {
        Some((run, events, n)) => Start {
            snapshot: None,
            run: Some((run, events.clone(), reader(&events)?, n)),
        },
        None => {
            let messages = crate::history::newest_messages(rt, thread_id).await?;
            // Interrupts wait for answers only when no run is answering them.
            let pending = if active.is_some() {
                Vec::new()
            } else {
                pending
            };
            let run_id = format!("connect-{}", uuid::Uuid::new_v4());
            let frames = snapshot_frames(
                thread_id,
                &run_id,
                q.dialect,
                messages,
                pending,
                rt.now_ms(),
            );
            let run = active
                .and_then(|r| Some((r.clone(), rt.replays().get(caller, thread_id, &r)?)))
                .filter(|(_, events)| events.has_after(0));
            let run = match run {
                Some((r, events)) => Some((r, events.clone(), reader(&events)?, 0)),
                None => None,
            };
            Start {
                snapshot: Some(frames),
                run,
            }
        }
    };
    let (tx, rx) = mpsc::channel(rt.channel_capacity().max(1));
    let rt = rt.clone();
    let thread = thread_id.to_owned();
    let caller = caller.clone();
    tokio::spawn(async move {
        stream(&rt, &caller, &thread, start, starts, &tx).await;
    });
    Ok(sse(rx, heartbeat))
}

/// Sends the snapshot, the run to follow, then (following) each later run of the thread that
/// is the caller's (a thread deleted and made again by someone else is followed no further).
async fn stream(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
    start: Start,
    mut starts: Option<broadcast::Receiver<(String, String)>>,
    tx: &mpsc::Sender<Bytes>,
) {
    let stall = rt.settings().client_stall_timeout;
    for f in start.snapshot.into_iter().flatten() {
        if sink::deliver(tx, f, stall, None).await != sink::Delivery::Sent {
            return;
        }
    }
    let mut done = Vec::new();
    if let Some((run, events, reader, after)) = start.run {
        if !follow_run(rt, &run, &events, reader, after, tx).await {
            return;
        }
        done.push(run);
    }
    let Some(starts) = starts.as_mut() else {
        return;
    };
    loop {
        let next = tokio::select! {
            n = starts.recv() => n,
            _ = tx.closed() => return,
        };
        let runs: Vec<(String, Arc<RunEvents>)> = match next {
            Ok((t, r)) if t == thread_id => rt
                .replays()
                .get(caller, &t, &r)
                .map(|e| vec![(r, e)])
                .unwrap_or_default(),
            Ok(_) => continue,
            // Fell behind the news: the thread's buffered runs not sent yet.
            Err(broadcast::error::RecvError::Lagged(_)) => {
                rt.replays().of_thread(caller, thread_id)
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        for (run, events) in runs {
            if done.contains(&run) {
                continue;
            }
            // A run followed by as many readers as it takes is passed over, not the stream.
            let Some(reader) = events.attach_reader(rt.limits().readers_per_run()) else {
                rt.limits().reached(crate::telemetry::Limit::Readers);
                done.push(run);
                continue;
            };
            if !follow_run(rt, &run, &events, reader, 0, tx).await {
                return;
            }
            done.push(run);
            // Only the newest few are remembered: a run id is used once per thread.
            if done.len() > 64 {
                done.remove(0);
            }
        }
    }
}

/// One run's events after `after`, relabelled, until its end, as the reader `_reader`; false when
/// the stream ends here (the client left or stalled, or the run's events went while it read).
async fn follow_run(
    rt: &Runtime,
    run_id: &str,
    events: &Arc<RunEvents>,
    _reader: Attached,
    after: u64,
    tx: &mpsc::Sender<Bytes>,
) -> bool {
    let stall = rt.settings().client_stall_timeout;
    let mut cursor = after;
    loop {
        // Events dropped from the front of the buffer: this run cannot be given whole.
        let Ok(batch) = events.read_after(cursor) else {
            return false;
        };
        for f in &batch.frames {
            if sink::deliver(tx, relabel(f, run_id), stall, None).await != sink::Delivery::Sent {
                return false;
            }
        }
        if batch.complete {
            return true;
        }
        cursor = batch.cursor;
        tokio::select! {
            _ = events.changed_after(cursor) => {}
            _ = tx.closed() => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(last: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = last {
            h.insert("last-event-id", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn connect_queries() {
        let q = connect_query(&headers(None), None).unwrap();
        assert_eq!(
            (q.follow, q.dialect, q.resume),
            (false, Dialect::Legacy, None)
        );
        let q = connect_query(
            &headers(Some("run:a:12")),
            Some("follow=true&protocolVersion=1.0"),
        )
        .unwrap();
        assert_eq!(
            (q.follow, q.dialect, q.resume),
            (true, Dialect::V1, Some(("run:a".into(), 12)))
        );
        assert_eq!(
            connect_query(&headers(Some("")), None).unwrap().resume,
            None
        );
        for (last, query) in [
            (None, "follow=yes"),
            (None, "follow=true&follow=true"),
            (None, "protocolVersion=2.0"),
            (Some("12"), ""),
            (Some(":12"), ""),
            (Some("r:"), ""),
            (Some("r:-1"), ""),
            (Some("r:99999999999999999999"), ""),
        ] {
            assert_eq!(
                connect_query(&headers(last), Some(query)).map_err(|e| e.code),
                Err(Code::InvalidInput),
                "{last:?} {query}"
            );
        }
    }

    #[test]
    fn frames_are_relabelled_with_their_run() {
        assert_eq!(
            &relabel(b"id: 7\ndata: {}\n\n", "r1")[..],
            b"id: r1:7\ndata: {}\n\n"
        );
        assert_eq!(&relabel(b": heartbeat\n\n", "r1")[..], b": heartbeat\n\n");
    }

    #[test]
    fn the_snapshot_is_a_run_that_restores_the_thread() {
        let frames = snapshot_frames(
            "t",
            "connect-1",
            Dialect::V1,
            vec![serde_json::json!({"id": "m", "role": "user", "content": "hi"})],
            vec![],
            0,
        );
        let events: Vec<Value> = frames
            .iter()
            .map(|f| {
                let s = std::str::from_utf8(f).unwrap();
                serde_json::from_str(s.strip_prefix("data: ").unwrap().trim()).unwrap()
            })
            .collect();
        assert_eq!(events[0]["type"], "RUN_STARTED");
        assert_eq!(events[0]["protocolVersion"], "1.0");
        assert_eq!(events[1]["type"], "MESSAGES_SNAPSHOT");
        assert_eq!(events[1]["messages"][0]["content"], "hi");
        assert_eq!(events[2]["outcome"]["type"], "success");
        assert_eq!(events[2]["runId"], "connect-1");
    }
}
