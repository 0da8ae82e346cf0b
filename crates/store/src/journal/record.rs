//! The journal's file format: records, and the generations on disk.
//!
//! Record: magic · payload length (u32 LE) · CRC-32 of the payload (u32 LE) · payload, where the
//! payload is thread-id length (u32 LE) · thread id · bytes. The magic says what the bytes are:
//! `AGJ1` a thread's whole document, `AGT1` the lines appended to its transcript. Reading stops at
//! the first short or damaged record: a later record can only have been acknowledged after every
//! earlier one was synced, so nothing acknowledged lies behind a torn tail.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"AGJ1";
const TRANSCRIPT_MAGIC: &[u8; 4] = b"AGT1";
const HEADER: usize = 12;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A thread's whole document.
    Doc,
    /// Lines appended to a thread's transcript.
    Transcript,
}

/// One record read back.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub kind: Kind,
    pub thread_id: String,
    pub bytes: Vec<u8>,
}

/// Encodes one record.
pub(crate) fn encode(thread_id: &str, doc: &[u8]) -> Vec<u8> {
    encode_kind(Kind::Doc, thread_id, doc)
}

pub(crate) fn encode_kind(kind: Kind, thread_id: &str, doc: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + thread_id.len() + doc.len());
    payload.extend_from_slice(&(thread_id.len() as u32).to_le_bytes());
    payload.extend_from_slice(thread_id.as_bytes());
    payload.extend_from_slice(doc);
    let mut rec = Vec::with_capacity(HEADER + payload.len());
    rec.extend_from_slice(match kind {
        Kind::Doc => MAGIC,
        Kind::Transcript => TRANSCRIPT_MAGIC,
    });
    rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    rec.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    rec.extend_from_slice(&payload);
    rec
}

/// Decodes the records of one journal file, in order, stopping at the first short or damaged
/// one.
pub(super) fn decode(mut bytes: &[u8]) -> Vec<Record> {
    let mut out = Vec::new();
    while bytes.len() >= HEADER {
        let kind = match &bytes[..4] {
            m if m == MAGIC => Kind::Doc,
            m if m == TRANSCRIPT_MAGIC => Kind::Transcript,
            _ => break,
        };
        let len = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        let Some(payload) = bytes.get(HEADER..HEADER + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc || payload.len() < 4 {
            break;
        }
        let id_len = u32::from_le_bytes(payload[..4].try_into().expect("4 bytes")) as usize;
        let Some(id) = payload.get(4..4 + id_len) else {
            break;
        };
        let Ok(id) = std::str::from_utf8(id) else {
            break;
        };
        out.push(Record {
            kind,
            thread_id: id.to_owned(),
            bytes: payload[4 + id_len..].to_vec(),
        });
        bytes = &bytes[HEADER + len..];
    }
    out
}

/// The newest document of each thread.
pub(super) type Newest = BTreeMap<String, Vec<u8>>;

/// What the generations `gens` hold: the newest document of each thread, and every transcript
/// record in the order written.
pub(super) fn read_left(gens: &[(u64, PathBuf)]) -> std::io::Result<(Newest, Vec<Record>)> {
    let mut newest = BTreeMap::new();
    let mut appends = Vec::new();
    for (_, path) in gens {
        for r in decode(&fs::read(path)?) {
            match r.kind {
                Kind::Doc => {
                    newest.insert(r.thread_id, r.bytes);
                }
                Kind::Transcript => appends.push(r),
            }
        }
    }
    Ok((newest, appends))
}

/// Journal generations present in `dir`, oldest first.
pub(super) fn generations(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(vec![])
        }
        Err(e) => return Err(e),
    };
    let mut gens = vec![];
    for e in entries {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name
            .strip_suffix(".log")
            .and_then(|s| s.parse::<u64>().ok())
        {
            gens.push((n, e.path()));
        }
    }
    gens.sort();
    Ok(gens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_reading_stops_at_damage() {
        let mut bytes = encode("t1", b"{\"a\":1}\n");
        bytes.extend(encode_kind(Kind::Transcript, "中文", b"{}"));
        let rec = |kind, id: &str, b: &[u8]| Record {
            kind,
            thread_id: id.to_owned(),
            bytes: b.to_vec(),
        };
        assert_eq!(
            decode(&bytes),
            vec![
                rec(Kind::Doc, "t1", b"{\"a\":1}\n"),
                rec(Kind::Transcript, "中文", b"{}")
            ]
        );
        // Every truncation keeps exactly the whole records before the cut.
        let first = encode("t1", b"{\"a\":1}\n").len();
        for cut in 0..bytes.len() {
            let n = decode(&bytes[..cut]).len();
            assert_eq!(n, usize::from(cut >= first), "cut at {cut}");
        }
        // A flipped bit in the second record drops it and only it.
        let mut damaged = bytes.clone();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert_eq!(decode(&damaged).len(), 1);
        // Garbage at the start: nothing.
        assert!(decode(b"AGJ0\0\0\0\0\0\0\0\0").is_empty());
    }
}
