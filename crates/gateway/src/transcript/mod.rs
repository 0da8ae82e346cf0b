//! A thread's transcript: the AG-UI messages of its runs, as their clients saw them, kept so that
//! a client that comes back (a reload, a restart, another device) gets the conversation from the
//! gateway instead of keeping it itself.
//!
//! - the stores keep them (`store::ThreadStore::append_transcript`, `read_transcript`): each
//!   entry numbered per thread (`seq`, from 1, never reused), at most `--transcript-limit` per
//!   thread (the oldest go first).
//!
//! A message is an AG-UI `Message` (`user`, `assistant` with its tool calls, `tool`,
//! `reasoning`, `activity`). Interrupts, the answers to them and a run's error are `activity`
//! messages of their own types ([`INTERRUPT`], [`INTERRUPT_RESPONSE`], [`RUN_ERROR`]), which
//! every AG-UI client accepts and none sends back to an agent. Images a user sent are not kept
//! (a text part names each), and no text is kept beyond [`MAX_TEXT_BYTES`] a message. A run's
//! messages are built from the events it sends by `run::record`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `--transcript-limit`'s default: messages kept per thread.
pub const DEFAULT_LIMIT: usize = 1000;
/// The most messages one page of a transcript holds (and its default).
pub const MAX_PAGE: usize = 200;
pub const DEFAULT_PAGE: usize = 50;
/// Text kept of one message's content, a tool call's arguments or a tool result (the rest is
/// cut at a character boundary).
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// A resume answer's payload larger than this (as JSON) is not kept (its status is).
pub const MAX_PAYLOAD_BYTES: usize = 16 * 1024;

/// The `activityType` of an interrupt a run ended with.
pub const INTERRUPT: &str = "iac-code.interrupt";
/// The `activityType` of the answer a client sent to an interrupt.
pub const INTERRUPT_RESPONSE: &str = "iac-code.interrupt-response";
/// The `activityType` of a run's error (its code and message, as the client saw them).
pub const RUN_ERROR: &str = "iac-code.run-error";

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
