//! Threads read back: `GET /threads?limit=&cursor=&archived=` lists the caller's threads, newest
//! activity first (`store::listing`), and `GET /threads/{threadId}/messages?before=&limit=`
//! pages through a thread's transcript (`transcript`), newest page first. Scoped like
//! `GET /threads/{threadId}`: a caller with a user reaches only that user's threads, and
//! another's is a thread that does not exist; a caller without a user (no authentication, the
//! service token acting for nobody) reaches every thread.
//!
//! The answer is `{"threadId", "entries": [{"seq", "runId", "at", "message"}], "nextBefore"}`:
//! `message` is the AG-UI message as the client saw it; `nextBefore` (absent on the oldest page)
//! is what to send as `before` for the page before this one.

use serde_json::{json, Value};

use crate::auth::access::{AGENTS_STATE_ROUTE, MESSAGES_ROUTE};
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::threads_api::read_theirs;
use engine::run::Runtime;
use store::listing::{self, Cursor, ListQuery};

/// The most messages one page of a transcript holds, and its default.
const MAX_PAGE: usize = 200;
const DEFAULT_PAGE: usize = 50;

/// Where a page ends and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageQuery {
    /// Only entries numbered below this; `None` is the newest page.
    pub before: Option<u64>,
    pub limit: usize,
}

/// Reads `before` and `limit` from a query string (pure). Other keys are ignored; a key given
/// twice, an empty value, a number that is not one, `before=0` or a limit outside 1..=200 is
/// refused rather than guessed at.
pub fn page_query(query: Option<&str>) -> Result<PageQuery, ApiError> {
    let bad = || ApiError::new(Code::InvalidInput, msg::BAD_PAGE);
    let mut before = None;
    let mut limit = None;
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let slot = match &*k {
            "before" => &mut before,
            "limit" => &mut limit,
            _ => continue,
        };
        if slot.is_some() || v.is_empty() || v.len() > 19 || !v.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        *slot = Some(v.parse::<u64>().map_err(|_| bad())?);
    }
    let limit = match limit {
        None => DEFAULT_PAGE,
        Some(n) if (1..=MAX_PAGE as u64).contains(&n) => n as usize,
        Some(_) => return Err(bad()),
    };
    if before == Some(0) {
        return Err(bad());
    }
    Ok(PageQuery { before, limit })
}

/// Reads `limit`, `cursor` and `archived` of `GET /threads` (pure); the same refusals as
/// [`page_query`], and a cursor this gateway did not make is refused.
pub fn list_query(query: Option<&str>, caller: &Caller) -> Result<ListQuery, ApiError> {
    let bad = || ApiError::new(Code::InvalidInput, msg::BAD_LIST_PAGE);
    let (mut limit, mut cursor, mut archived) = (None, None, None);
    for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let slot = match &*k {
            "limit" => &mut limit,
            "cursor" => &mut cursor,
            "archived" => &mut archived,
            _ => continue,
        };
        if slot.is_some() || v.is_empty() {
            return Err(bad());
        }
        *slot = Some(v.into_owned());
    }
    let limit = match limit {
        None => listing::DEFAULT_PAGE,
        Some(n) if n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit()) => {
            match n.parse::<usize>() {
                Ok(n) if (1..=listing::MAX_PAGE).contains(&n) => n,
                _ => return Err(bad()),
            }
        }
        Some(_) => return Err(bad()),
    };
    let after = match cursor {
        None => None,
        Some(c) => Some(Cursor::decode(&c).ok_or_else(bad)?),
    };
    let archived = match archived.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(bad()),
    };
    Ok(ListQuery {
        user: caller.user.clone(),
        archived,
        after,
        limit,
    })
}

/// `GET /threads` after the checks of the route (method, token).
pub async fn list(rt: &Runtime, q: ListQuery) -> Result<Value, ApiError> {
    let page = rt.threads().store().list_threads(q).await.map_err(|e| {
        tracing::warn!(error = %e, "listing the threads failed");
        ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
    })?;
    let threads: Vec<Value> = page
        .threads
        .iter()
        .map(crate::thread_edit::summary_json)
        .collect();
    let mut answer = json!({ "threads": threads });
    if let Some(last) = page.threads.last().filter(|_| page.more) {
        answer["nextCursor"] = json!(last.position().encode());
    }
    Ok(answer)
}

/// The most messages `POST /agents/state` answers with (the newest; older ones are read with
/// `GET /threads/{threadId}/messages`).
pub const STATE_MESSAGES: usize = 1000;
/// The most bytes of messages (as JSON) a snapshot carries: the newest that fit. A connect's
/// snapshot stays in memory until its client has read it, however slowly it reads.
pub const STATE_BYTES: usize = 4 * 1024 * 1024;

/// `POST /agents/state` (the convention of ADK's adapter) after the checks of the route: the
/// thread's newest messages, as AG-UI messages. A thread that does not exist, or is another
/// user's, is `threadExists: false` with nothing in it. The gateway keeps no agent state of its
/// own (a run's `state` is not used), so `state` is `{}`.
pub async fn agents_state(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
) -> Result<Value, ApiError> {
    let absent = json!({"threadId": thread_id, "threadExists": false, "state": {}, "messages": []});
    if engine::run::hold::check_thread_id(thread_id).is_err() {
        return Ok(absent);
    }
    match read_theirs(rt, AGENTS_STATE_ROUTE, caller, thread_id, |_, _| ()).await {
        Ok(()) => {}
        Err(e) if e.code == Code::ThreadNotFound => return Ok(absent),
        Err(e) => return Err(e),
    }
    let messages = newest_messages(rt, thread_id).await?;
    Ok(json!({"threadId": thread_id, "threadExists": true, "state": {}, "messages": messages}))
}

/// The thread's newest [`STATE_MESSAGES`] messages, oldest first.
pub async fn newest_messages(rt: &Runtime, thread_id: &str) -> Result<Vec<Value>, ApiError> {
    // One read of the bound (not pages of the route's size: the file store reads the whole
    // transcript for each).
    let page = rt
        .threads()
        .store()
        .read_transcript(thread_id, None, STATE_MESSAGES)
        .await
        .map_err(|e| {
            tracing::warn!(thread_id, error = %e, "reading the transcript failed");
            ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
        })?;
    Ok(distinct_ids(newest_within(
        page.entries.into_iter().map(|e| e.message).collect(),
        STATE_BYTES,
    )))
}

/// Messages whose ids are all distinct: a transcript written before a resumed run's text had an
/// id of its own holds two messages under one id, which a client's snapshot would merge into
/// one; the later is listed as `<id>-2` (the first free of `-2`, `-3`, …), as a run names them
/// now (pure).
fn distinct_ids(mut messages: Vec<Value>) -> Vec<Value> {
    let id_of = |m: &Value| m.get("id").and_then(Value::as_str).map(str::to_owned);
    let mut taken: std::collections::HashSet<String> = messages.iter().filter_map(id_of).collect();
    let mut listed = std::collections::HashSet::new();
    for m in &mut messages {
        let Some(id) = id_of(m) else { continue };
        if listed.insert(id.clone()) {
            continue;
        }
        let new = (2u64..)
            .map(|n| format!("{id}-{n}"))
            .find(|c| !taken.contains(c))
            .expect("a free id");
        taken.insert(new.clone());
        listed.insert(new.clone());
        m["id"] = json!(new);
    }
    messages
}

/// The newest of `messages` (oldest first) whose JSON fits in `max` bytes in all.
fn newest_within(mut messages: Vec<Value>, max: usize) -> Vec<Value> {
    /// Counts what is written.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut total = Count(0);
    let mut keep = messages.len();
    for (i, m) in messages.iter().enumerate().rev() {
        if serde_json::to_writer(&mut total, m).is_err() || total.0 > max {
            break;
        }
        keep = i;
    }
    messages.split_off(keep)
}

/// `GET /threads/{threadId}/messages` after the checks of the route (method, token, thread id).
pub async fn messages(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
    q: PageQuery,
) -> Result<Value, ApiError> {
    // Whose the thread is first: a stranger learns nothing, not even whether it has messages.
    read_theirs(rt, MESSAGES_ROUTE, caller, thread_id, |_, _| ()).await?;
    let page = rt
        .threads()
        .store()
        .read_transcript(thread_id, q.before, q.limit)
        .await
        .map_err(|e| {
            tracing::warn!(thread_id, error = %e, "reading the transcript failed");
            ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
        })?;
    let next = page
        .more
        .then(|| page.entries.first().map(|e| e.seq))
        .flatten();
    let mut answer = json!({"threadId": thread_id, "entries": page.entries});
    if let Some(n) = next {
        answer["nextBefore"] = json!(n);
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_lists_every_message_under_an_id_of_its_own() {
        let m = |id: &str, text: &str| json!({"id": id, "role": "assistant", "content": text});
        let old = vec![
            m("t-message", "Let me run"),
            json!({"id": "tool-result-1", "role": "tool", "toolCallId": "1", "content": "ok"}),
            m("t-message", "Done."),
            m("t-message-2", "A message of that name already"),
            m("t-message", "Again."),
            json!({"role": "user", "content": "no id"}),
        ];
        let ids: Vec<Value> = distinct_ids(old).iter().map(|m| m["id"].clone()).collect();
        assert_eq!(
            ids,
            [
                json!("t-message"),
                json!("tool-result-1"),
                json!("t-message-3"),
                json!("t-message-2"),
                json!("t-message-4"),
                Value::Null
            ]
        );
        // Distinct already: as it was.
        let fine = vec![m("a", "x"), m("b", "y")];
        assert_eq!(distinct_ids(fine.clone()), fine);
    }

    #[test]
    fn list_queries() {
        let alice = Caller {
            user: Some("alice".into()),
            ..Caller::OPEN
        };
        let q = list_query(None, &alice).unwrap();
        assert_eq!(q.user.as_deref(), Some("alice"));
        assert_eq!(
            (q.limit, q.archived, &q.after),
            (listing::DEFAULT_PAGE, false, &None)
        );
        let c = Cursor {
            at: "2026-01-01T00:00:00.000Z".into(),
            thread_id: "t".into(),
        };
        let q = list_query(
            Some(&format!("limit=100&archived=true&cursor={}", c.encode())),
            &Caller::OPEN,
        )
        .unwrap();
        assert_eq!(
            (q.limit, q.archived, q.after, q.user),
            (100, true, Some(c), None)
        );
        for bad in [
            "limit=0",
            "limit=101",
            "limit=1000000000000",
            "limit=",
            "limit=a",
            "cursor=abc",
            "cursor=",
            "archived=yes",
            "limit=1&limit=1",
        ] {
            assert_eq!(
                list_query(Some(bad), &alice).map_err(|e| e.code),
                Err(Code::InvalidInput),
                "{bad}"
            );
        }
    }

    #[test]
    fn page_queries() {
        let ok = |q: &str| page_query(Some(q)).map_err(|e| e.code);
        assert_eq!(
            page_query(None).unwrap(),
            PageQuery {
                before: None,
                limit: DEFAULT_PAGE
            }
        );
        assert_eq!(
            ok("before=7&limit=3"),
            Ok(PageQuery {
                before: Some(7),
                limit: 3
            })
        );
        assert_eq!(
            ok("x=y&limit=200"),
            Ok(PageQuery {
                before: None,
                limit: 200
            })
        );
        for bad in [
            "limit=0",
            "limit=201",
            "limit=",
            "limit=-1",
            "limit=1.5",
            "limit=%2B1",
            "before=0",
            "before=abc",
            "before=99999999999999999999",
            "before=1&before=2",
            "limit=1&limit=1",
        ] {
            assert_eq!(ok(bad), Err(Code::InvalidInput), "{bad}");
        }
    }

    #[test]
    fn a_snapshot_keeps_the_newest_messages_that_fit_its_bytes() {
        let m =
            |i: usize| json!({"id": format!("m{i}"), "role": "user", "content": "x".repeat(100)});
        let one = serde_json::to_vec(&m(0)).unwrap().len();
        let all: Vec<Value> = (0..10).map(m).collect();
        assert_eq!(newest_within(all.clone(), 10 * one), all);
        let kept = newest_within(all.clone(), 3 * one + one / 2);
        assert_eq!(kept, all[7..]);
        assert!(newest_within(all.clone(), one - 1).is_empty());
        assert!(newest_within(Vec::new(), 0).is_empty());
    }
}
