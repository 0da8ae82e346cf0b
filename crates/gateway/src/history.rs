//! A thread's past, read back: `GET /threads/{threadId}/messages?before=&limit=` pages through
//! its transcript (`transcript`), newest page first. Scoped like `GET /threads/{threadId}`: a
//! caller with a user reaches only that user's threads, and another's is a thread that does not
//! exist.
//!
//! The answer is `{"threadId", "entries": [{"seq", "runId", "at", "message"}], "nextBefore"}`:
//! `message` is the AG-UI message as the client saw it; `nextBefore` (absent on the oldest page)
//! is what to send as `before` for the page before this one.

use serde_json::{json, Value};

use crate::auth::access::MESSAGES_ROUTE;
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::run::Runtime;
use crate::threads_api::read_theirs;
use crate::transcript::{DEFAULT_PAGE, MAX_PAGE};

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
}
