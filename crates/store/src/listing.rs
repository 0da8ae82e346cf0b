//! A user's threads, listed (`GET /threads`): what each store keeps of a thread for the list
//! (its summary), the query a page answers and the opaque cursor that continues it (pure).
//!
//! Threads are listed newest activity first, then by thread id (descending), so a page ends at
//! a `(lastActivity, threadId)` pair and the next page starts strictly after it: a thread that
//! moves to the front meanwhile is not listed twice in a walk, and none is skipped that did not
//! move.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The longest title kept, in characters (the first user message's text, on one line).
pub const MAX_TITLE_CHARS: usize = 120;
/// The most threads a page lists, and how many when not said.
pub const MAX_PAGE: usize = 100;
pub const DEFAULT_PAGE: usize = 20;
/// The longest cursor accepted (base64 of a position: a time and a thread id of ≤ 256 bytes).
const MAX_CURSOR_BYTES: usize = 1024;

/// What the list shows of a thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadSummary {
    pub thread_id: String,
    /// The user the thread belongs to (its owner, else the user it was bound to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339, the thread's last save or run end; what the list is ordered by.
    pub last_activity_at: String,
    #[serde(default)]
    pub archived: bool,
    /// The run holding the thread as last saved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<String>,
    /// Its pending interrupts as last saved.
    #[serde(default)]
    pub pending: usize,
    /// The store's own exact ordering key when it is finer than `last_activity_at` (PostgreSQL's
    /// microseconds); never shown.
    #[serde(skip)]
    pub order_key: Option<String>,
}

impl ThreadSummary {
    /// A thread first seen `at`: no owner, title or run yet.
    pub fn new(thread_id: &str, at: &str) -> ThreadSummary {
        ThreadSummary {
            thread_id: thread_id.to_owned(),
            owner: None,
            title: None,
            created_at: at.to_owned(),
            last_activity_at: at.to_owned(),
            archived: false,
            active_run: None,
            pending: 0,
            order_key: None,
        }
    }

    /// Where this summary stands in the order.
    pub fn position(&self) -> Cursor {
        Cursor {
            at: self
                .order_key
                .clone()
                .unwrap_or_else(|| self.last_activity_at.clone()),
            thread_id: self.thread_id.clone(),
        }
    }
}

/// What `PATCH /threads/{id}` changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ThreadPatch {
    pub title: Option<String>,
    pub archived: Option<bool>,
}

impl ThreadPatch {
    pub fn apply(&self, s: &mut ThreadSummary) {
        if let Some(t) = &self.title {
            s.title = Some(t.clone());
        }
        if let Some(a) = self.archived {
            s.archived = a;
        }
    }
}

/// A position in the list: a page continues strictly after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    #[serde(rename = "t")]
    pub at: String,
    #[serde(rename = "i")]
    pub thread_id: String,
}

impl Cursor {
    pub fn encode(&self) -> String {
        B64.encode(serde_json::to_vec(self).expect("serialises"))
    }

    pub fn decode(s: &str) -> Option<Cursor> {
        if s.is_empty() || s.len() > MAX_CURSOR_BYTES {
            return None;
        }
        let bytes = B64.decode(s).ok()?;
        let c: Cursor = serde_json::from_slice(&bytes).ok()?;
        (!c.at.is_empty() && c.at.len() <= 64 && c.thread_id.len() <= 256).then_some(c)
    }
}

/// One page of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only this user's threads; `None` for a caller without a user (every thread).
    pub user: Option<String>,
    /// Archived threads instead of the others.
    pub archived: bool,
    pub after: Option<Cursor>,
    pub limit: usize,
}

/// A page: its threads, and whether more follow.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    pub threads: Vec<ThreadSummary>,
    pub more: bool,
}

/// The page `q` asks for out of every summary, by a scan: the definition that the file store's
/// ordered sets (`list_order`) are tested against.
#[cfg(test)]
pub fn select<'a>(all: impl Iterator<Item = &'a ThreadSummary>, q: &ListQuery) -> ListPage {
    let key = |s: &ThreadSummary| (s.position().at, s.thread_id.clone());
    let mut hits: Vec<&ThreadSummary> = all
        .filter(|s| q.user.is_none() || s.owner == q.user)
        .filter(|s| s.archived == q.archived)
        .filter(|s| {
            q.after
                .as_ref()
                .is_none_or(|c| key(s) < (c.at.clone(), c.thread_id.clone()))
        })
        .collect();
    hits.sort_by_key(|s| std::cmp::Reverse(key(s)));
    let more = hits.len() > q.limit;
    ListPage {
        threads: hits.into_iter().take(q.limit).cloned().collect(),
        more,
    }
}

/// A title from a user message's text: on one line, at most [`MAX_TITLE_CHARS`] characters.
pub fn title(text: &str) -> Option<String> {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let t: String = one_line.chars().take(MAX_TITLE_CHARS).collect();
    (!t.is_empty()).then_some(t)
}

/// The title of a run's messages: the first user message's text (a string, or its text parts).
pub fn title_of(messages: &[serde_json::Value]) -> Option<String> {
    let user = messages.iter().find(|m| m["role"] == "user")?;
    let text = match &user["content"] {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => return None,
    };
    title(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(id: &str, owner: &str, at: &str) -> ThreadSummary {
        ThreadSummary {
            owner: Some(owner.into()),
            ..ThreadSummary::new(id, at)
        }
    }

    fn ids(p: &ListPage) -> Vec<&str> {
        p.threads.iter().map(|t| t.thread_id.as_str()).collect()
    }

    #[test]
    fn pages_walk_newest_first_and_continue_after_their_last() {
        let all = [
            s("a", "u", "2026-01-01T00:00:01.000Z"),
            s("b", "u", "2026-01-01T00:00:03.000Z"),
            s("c", "u", "2026-01-01T00:00:02.000Z"),
            s("d", "u", "2026-01-01T00:00:02.000Z"),
            s("x", "v", "2026-01-01T00:00:09.000Z"),
        ];
        let mut q = ListQuery {
            user: Some("u".into()),
            archived: false,
            after: None,
            limit: 2,
        };
        let p = select(all.iter(), &q);
        assert_eq!((ids(&p), p.more), (vec!["b", "d"], true));
        q.after = Some(p.threads[1].position());
        let p = select(all.iter(), &q);
        assert_eq!((ids(&p), p.more), (vec!["c", "a"], false));
        q.user = None;
        q.after = None;
        q.limit = 10;
        assert_eq!(ids(&select(all.iter(), &q)), ["x", "b", "d", "c", "a"]);
        q.archived = true;
        assert!(select(all.iter(), &q).threads.is_empty());
    }

    #[test]
    fn cursors_round_trip_and_refuse_what_they_did_not_make() {
        let c = Cursor {
            at: "2026-01-01T00:00:01.000Z".into(),
            thread_id: "t/1".into(),
        };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        let long = Cursor {
            at: "x".into(),
            thread_id: "t".repeat(300),
        };
        for bad in [
            String::new(),
            "!!".into(),
            B64.encode(b"{}"),
            B64.encode(br#"{"t":"","i":"a"}"#),
            long.encode(),
            "A".repeat(2000),
        ] {
            assert_eq!(Cursor::decode(&bad), None, "{bad}");
        }
    }

    #[test]
    fn titles_are_one_line_and_bounded() {
        assert_eq!(title("  Create\n a   VPC \t"), Some("Create a VPC".into()));
        assert_eq!(title(" \n "), None);
        let long = title(&"é".repeat(500)).unwrap();
        assert_eq!(long.chars().count(), MAX_TITLE_CHARS);
        let m = [
            json!({"role": "activity", "content": {}}),
            json!({"role": "user", "content": [{"type": "text", "text": "Look at"}, {"type": "text", "text": "this"}]}),
            json!({"role": "user", "content": "later"}),
        ];
        assert_eq!(title_of(&m), Some("Look at this".into()));
        assert_eq!(title_of(&m[..1]), None);
    }
}
