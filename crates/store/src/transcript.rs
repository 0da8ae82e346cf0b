//! A thread's transcript as the stores keep it: the AG-UI messages of its runs, each numbered
//! per thread (`seq`, from 1, never reused), at most `--transcript-limit` per thread (the
//! oldest go first), read back a page at a time. What a run records is the engine's
//! (`run::record`); here are only the entries and their pages.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One stored message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Its number in the thread (from 1, increasing, never reused).
    pub seq: u64,
    pub run_id: String,
    /// RFC 3339, when the run's transcript was written.
    pub at: String,
    pub message: Value,
}

/// A page of a transcript: the newest `limit` entries before a `seq`, oldest first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Page {
    pub entries: Vec<Entry>,
    /// Older entries exist: the next page is read `before` the first entry's `seq`.
    pub more: bool,
}

/// The newest `limit` of `entries` (oldest first, each `seq` below `before`), as a page.
pub fn page_of(
    entries: impl DoubleEndedIterator<Item = Entry>,
    before: Option<u64>,
    limit: usize,
) -> Page {
    let mut newest: Vec<Entry> = entries
        .rev()
        .filter(|e| before.is_none_or(|b| e.seq < b))
        .take(limit + 1)
        .collect();
    let more = newest.len() > limit;
    newest.truncate(limit);
    newest.reverse();
    Page {
        entries: newest,
        more,
    }
}

/// Numbers `messages` after `last` (the thread's newest `seq`, 0 when none).
pub fn number(last: u64, run_id: &str, at: &str, messages: Vec<Value>) -> Vec<Entry> {
    messages
        .into_iter()
        .enumerate()
        .map(|(i, message)| Entry {
            seq: last + 1 + i as u64,
            run_id: run_id.to_owned(),
            at: at.to_owned(),
            message,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entries(n: u64) -> Vec<Entry> {
        number(0, "r", "t", (0..n).map(|i| json!({"id": i})).collect())
    }

    #[test]
    fn pages_go_back_from_the_newest() {
        let all = entries(5);
        let p = page_of(all.clone().into_iter(), None, 2);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
        assert!(p.more);
        let p = page_of(all.clone().into_iter(), Some(4), 2);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
        assert!(p.more);
        let p = page_of(all.clone().into_iter(), Some(2), 2);
        assert_eq!(p.entries.iter().map(|e| e.seq).collect::<Vec<_>>(), [1]);
        assert!(!p.more);
        let p = page_of(all.into_iter(), None, 5);
        assert_eq!(p.entries.len(), 5);
        assert!(!p.more);
    }

    #[test]
    fn numbering_follows_the_last_seq() {
        let e = number(7, "r1", "at", vec![json!(1), json!(2)]);
        assert_eq!((e[0].seq, e[1].seq), (8, 9));
        assert_eq!(e[1].run_id, "r1");
    }
}
