//! The file store's seal of whom a thread belongs to: `ownerMac`, an HMAC-SHA256 over the thread
//! id, its `owner` and its `userId` (`ThreadDoc::owner_or_user` reads both), under a key of the
//! state directory (`<state-dir>/owner.key`, 32 random bytes, 0600). A document that names
//! someone and has no valid seal was changed outside the gateway: the store refuses to load it,
//! so it is never served and its id is not taken over.
//!
//! It protects against a writer of the documents that cannot read the key (a kernel confined
//! away from it); a process that reads the key, or deletes it before a start, can forge. The
//! documents of a directory that had no key yet are sealed when the key is made: under a
//! pending name first, renamed once they all are, so a start cut short resumes with that key.

use std::path::Path;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::fs::{self, DirSync, Loaded};
use super::{StoreError, ThreadDoc};

pub(super) const KEY_FILE: &str = "owner.key";
const PENDING_FILE: &str = "owner.key.pending";
const KEY_LEN: usize = 32;

/// The key, and the seals it makes and checks.
pub(super) struct Seal {
    key: [u8; KEY_LEN],
}

/// What the MAC covers: a JSON array, so no two inputs read alike (a missing owner is `null`,
/// not an empty string).
fn sealed_input(doc: &ThreadDoc) -> Vec<u8> {
    let input = (
        "iac-code-agui owner v1",
        &doc.thread_id,
        &doc.owner,
        &doc.user_id,
    );
    serde_json::to_vec(&input).expect("strings serialise")
}

impl Seal {
    fn hmac(&self, doc: &ThreadDoc) -> Hmac<Sha256> {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        m.update(&sealed_input(doc));
        m
    }

    /// The seal a document carries: none when it names nobody (only callers without a user
    /// reach it, as they reach every thread).
    pub(super) fn mac(&self, doc: &ThreadDoc) -> Option<String> {
        doc.owner_or_user()?;
        Some(hex::encode(self.hmac(doc).finalize().into_bytes()))
    }

    /// Whether a document read with `mac` may be served: it names nobody, or its seal is right.
    pub(super) fn admits(&self, doc: &ThreadDoc, mac: Option<&str>) -> bool {
        if doc.owner_or_user().is_none() {
            return true;
        }
        let Some(bytes) = mac.and_then(|m| hex::decode(m).ok()) else {
            return false;
        };
        self.hmac(doc).verify_slice(&bytes).is_ok()
    }
}

/// The directory's key, and whether it is being made in this open (`true`: seal the documents
/// that have no seal, then [`adopted`]).
pub(super) fn open(root: &Path, sync: &DirSync) -> Result<(Seal, bool), StoreError> {
    if let Some(key) = read(&root.join(KEY_FILE))? {
        return Ok((Seal { key }, false));
    }
    if let Some(key) = read(&root.join(PENDING_FILE))? {
        return Ok((Seal { key }, true));
    }
    let key: [u8; KEY_LEN] = rand::random();
    fs::replace(root, PENDING_FILE, &key, Some(sync))?;
    Ok((Seal { key }, true))
}

/// The documents are sealed: the pending key becomes the key.
pub(super) fn adopted(root: &Path) -> Result<(), StoreError> {
    std::fs::rename(root.join(PENDING_FILE), root.join(KEY_FILE))?;
    fs::sync_dir(root)?;
    Ok(())
}

fn read(path: &Path) -> Result<Option<[u8; KEY_LEN]>, StoreError> {
    match fs::read_private(path, KEY_LEN as u64)? {
        Loaded::Missing => Ok(None),
        Loaded::Refused(why) => Err(StoreError::Invalid(format!("{}: {why}", path.display()))),
        Loaded::Bytes(b) => b.try_into().map(Some).map_err(|_| {
            StoreError::Invalid(format!("{}: not a key of {KEY_LEN} bytes", path.display()))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Execution;

    fn doc(owner: Option<&str>, user: Option<&str>) -> ThreadDoc {
        let mut d = ThreadDoc::new(
            "t1",
            "c",
            "/w",
            user.map(Into::into),
            Execution::new("e", "i"),
        );
        d.owner = owner.map(Into::into);
        d
    }

    /// A seal is for its thread, its owner and its user: any of them changed, or another key,
    /// and it is refused; a document naming nobody needs none.
    #[test]
    fn a_seal_holds_for_its_thread_and_owners_only() {
        let (seal, other) = (Seal { key: [7; 32] }, Seal { key: [8; 32] });
        let alice = doc(Some("alice"), Some("alice"));
        let mac = seal.mac(&alice).unwrap();
        assert_eq!(mac.len(), 64);
        assert!(seal.admits(&alice, Some(&mac)));
        assert!(!other.admits(&alice, Some(&mac)));
        assert!(!seal.admits(&alice, None));
        assert!(!seal.admits(&alice, Some("zz")));
        let forged = [
            doc(Some("mallory"), Some("alice")),
            doc(None, Some("alice")),
            doc(None, Some("mallory")),
            doc(Some("alice"), None),
            doc(Some("alice"), Some("mallory")),
        ];
        for d in &forged {
            assert!(!seal.admits(d, Some(&mac)), "{:?} {:?}", d.owner, d.user_id);
        }
        let mut elsewhere = alice.clone();
        elsewhere.thread_id = "t2".into();
        assert!(!seal.admits(&elsewhere, Some(&mac)));
        let nobody = doc(None, None);
        assert_eq!(seal.mac(&nobody), None);
        assert!(seal.admits(&nobody, None));
    }

    /// The key is made once, pending until adopted, and read back after.
    #[test]
    fn the_key_is_made_pending_then_kept() {
        let d = tempfile::tempdir().unwrap();
        let sync = DirSync::default();
        let (first, making) = open(d.path(), &sync).unwrap();
        assert!(making);
        let alice = doc(Some("alice"), None);
        let mac = first.mac(&alice);
        // A start cut short before the adoption resumes with the same key.
        let (again, making) = open(d.path(), &sync).unwrap();
        assert!(making);
        assert_eq!(again.mac(&alice), mac);
        adopted(d.path()).unwrap();
        let (kept, making) = open(d.path(), &sync).unwrap();
        assert!(!making);
        assert_eq!(kept.mac(&alice), mac);
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(d.path().join(KEY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        std::fs::write(d.path().join(KEY_FILE), b"short").unwrap();
        assert!(open(d.path(), &sync).is_err());
    }
}
