//! The writes that rewrite or mend a transcript file: its compaction (the kept entries and the
//! summary, replacing the file atomically and durably) and the start-up's append of what a
//! journal record holds and the file lacks.

use std::path::Path;

use super::super::fs::{self, DirSync};
use super::super::listing::ThreadSummary;
use super::super::StoreError;
use super::{line_of, parse, summary_line, write, Committed, Durable, Header, Keep, Locks, Make};
use super::{Entry, BUDGET_BYTES};

/// Appends again, durably, what a transcript lacks of a journal record's lines (start-up, after a
/// crash, one record at a time in the journal's order): the entries above the file's newest, with
/// what that write kept (`from`) and the file's own summary when it has one (it is what the list
/// showed last: a rename may have been written since). A record whose entries the file has
/// changes nothing.
pub(crate) fn replay(
    root: &Path,
    locks: &Locks,
    dir_sync: &DirSync,
    thread_id: &str,
    lines: &[u8],
) -> Result<(), StoreError> {
    let (entries, header) = parse(thread_id, lines);
    let Some(Header {
        thread: summary,
        last: Some(last),
        from: Some(from),
        ..
    }) = header
    else {
        return Err(StoreError::Invalid(
            "a journal record of a transcript without its summary".into(),
        ));
    };
    let durable = Durable {
        dir_sync,
        journal: None,
        with_doc: None,
    };
    let make: Make<'_> = Box::new(|newest, on_disk| {
        (newest < last).then(|| {
            let missing = entries.into_iter().filter(|e| e.seq > newest).collect();
            (missing, on_disk.cloned().unwrap_or(summary))
        })
    });
    write(root, locks, durable, thread_id, Keep::From(from), make)?;
    Ok(())
}

/// Replaces the file by `all` (those `keep` keeps) and the summary, atomically and durably.
pub(super) fn compact(
    dir: &Path,
    name: &str,
    dir_sync: &DirSync,
    mut all: Vec<Entry>,
    last: u64,
    keep: Keep,
    summary: ThreadSummary,
) -> Result<(), StoreError> {
    match keep {
        Keep::Newest(l) => {
            all.drain(..all.len().saturating_sub(l));
        }
        Keep::From(f) => all.retain(|e| e.seq >= f),
        Keep::All => {}
    }
    let mut encoded = Vec::with_capacity(all.len());
    for e in &all {
        let mut line = Vec::new();
        line_of(&mut line, e)?;
        encoded.push(line);
    }
    // Within the budget with the summary: the oldest go first. The summary is measured with its
    // largest numbers (every entry gone, every entry kept), so the one written is no longer.
    let mut widest = Vec::new();
    let most = Committed {
        last,
        from: last + 1,
        lines: all.len() as u64 + 1,
    };
    summary_line(&mut widest, summary.clone(), most)?;
    let room = BUDGET_BYTES.saturating_sub(widest.len() as u64);
    let mut total: u64 = encoded.iter().map(|l| l.len() as u64).sum();
    let mut first = 0;
    while total > room && first < encoded.len() {
        total -= encoded[first].len() as u64;
        first += 1;
    }
    all.drain(..first);
    let from = all.first().map_or(last + 1, |e| e.seq);
    let mut bytes = Vec::with_capacity(total as usize + 1024);
    for line in &encoded[first..] {
        bytes.extend_from_slice(line);
    }
    let lines = all.len() as u64 + 1;
    summary_line(&mut bytes, summary, Committed { last, from, lines })?;
    fs::replace(dir, name, &bytes, Some(dir_sync))?;
    Ok(())
}
