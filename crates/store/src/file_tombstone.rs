//! The file store's tombstones: `<state-dir>/deleted/<stem>`, how many threads of an id were
//! deleted, in decimal. A thread made again under the id is that incarnation of it, with a kernel
//! context of its own (the kernel keys its conversations by context).
//!
//! One small file per deleted id, kept for good: a tombstone that went would give the next
//! thread of the id the context of the first one again. They cost one file per deletion, never
//! read but when a thread is made under an id that has no document. The reference adapter never
//! looks in this directory.

use std::path::{Path, PathBuf};

use super::file_stem;
use super::fs::{self, DirSync, Loaded};
use super::StoreError;

/// The largest tombstone read (a count in decimal; anything longer is not one).
const MAX_TOMBSTONE: u64 = 32;

fn dir(root: &Path) -> PathBuf {
    root.join("deleted")
}

fn stem(thread_id: &str) -> Result<String, StoreError> {
    file_stem(thread_id).ok_or_else(|| StoreError::Invalid("empty thread id".into()))
}

/// How many threads of `thread_id` were deleted (0: none, or no tombstone). A tombstone that
/// cannot be read is an error, never a first incarnation: that would reuse the first context.
pub(super) fn read(root: &Path, thread_id: &str) -> Result<u64, StoreError> {
    match fs::read_private(&dir(root).join(stem(thread_id)?), MAX_TOMBSTONE)? {
        Loaded::Missing => Ok(0),
        Loaded::Refused(why) => Err(StoreError::Invalid(format!("tombstone: {why}"))),
        Loaded::Bytes(b) => parse(&b),
    }
}

fn parse(bytes: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or_else(|| StoreError::Invalid("tombstone: not a count".into()))
}

/// Counts one more deleted thread of `thread_id`, durably (before its document goes: a crash
/// between the two leaves the thread and a higher count, never a thread made again over a
/// tombstone that was not written).
pub(super) fn bump(root: &Path, thread_id: &str, sync: &DirSync) -> Result<u64, StoreError> {
    let n = read(root, thread_id)?.saturating_add(1);
    fs::replace(
        &dir(root),
        &stem(thread_id)?,
        format!("{n}\n").as_bytes(),
        Some(sync),
    )?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_deletion_and_refuses_garbage() {
        let d = tempfile::tempdir().unwrap();
        let sync = DirSync::default();
        assert_eq!(read(d.path(), "t1").unwrap(), 0);
        assert_eq!(bump(d.path(), "t1", &sync).unwrap(), 1);
        assert_eq!(bump(d.path(), "t1", &sync).unwrap(), 2);
        assert_eq!(read(d.path(), "t1").unwrap(), 2);
        assert_eq!(read(d.path(), "T1").unwrap(), 0, "another id, another file");
        std::fs::write(d.path().join("deleted/t1"), "two").unwrap();
        assert!(matches!(read(d.path(), "t1"), Err(StoreError::Invalid(_))));
        assert!(bump(d.path(), "t1", &sync).is_err());
    }
}
