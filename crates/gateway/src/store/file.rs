//! The file store: `<root>/threads/<stem>.json`, 0700 directories (when created by us, D-19),
//! 0600 files, atomic replace with fsync of file and directory, no-follow reads.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use sha2::{Digest, Sha256};

use super::{StoreError, ThreadDoc, ThreadStore};
use crate::validate::content::is_reserved_windows_name;

/// Largest accepted state file (a thread document is small; this only guards against garbage).
const MAX_FILE: u64 = 64 * 1024 * 1024;

/// The file stem of a thread id (§16.2 with D-19): verbatim, `aguiid~<hex>` or `aguihash~<sha256>`.
pub fn file_stem(thread_id: &str) -> Option<String> {
    if thread_id.is_empty() {
        return None;
    }
    let verbatim_ok = thread_id.len() <= 200
        && thread_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && thread_id == thread_id.to_ascii_lowercase()
        && thread_id != "."
        && thread_id != ".."
        && !thread_id.ends_with('.')
        && {
            let stripped = thread_id.trim_end_matches('.');
            let stem = stripped
                .split('.')
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            !is_reserved_windows_name(&stem)
        };
    if verbatim_ok {
        return Some(thread_id.to_owned());
    }
    let hexed = format!("aguiid~{}", hex::encode(thread_id.as_bytes()));
    if hexed.len() <= 200 {
        return Some(hexed);
    }
    Some(format!(
        "aguihash~{}",
        hex::encode(Sha256::digest(thread_id.as_bytes()))
    ))
}

/// Thread documents under `<root>/threads/`.
#[derive(Debug, Clone)]
pub struct FileStore {
    root: PathBuf,
    dir_sync: Arc<DirSync>,
}

/// Group commit of the threads directory: one `fsync` of the directory makes every rename done
/// before it started durable, so concurrent writers share it instead of queueing one each.
#[derive(Debug, Default)]
struct DirSync {
    state: Mutex<SyncState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Requests so far (each made after its rename).
    requested: u64,
    /// Requests covered by a completed fsync.
    covered: u64,
    running: bool,
    /// Directory fsyncs run so far.
    syncs: u64,
}

impl DirSync {
    /// Returns once an fsync of `dir` that started after this call has completed (or fails with
    /// the error of the one this caller ran).
    fn sync(&self, dir: &Path) -> std::io::Result<()> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.requested += 1;
        let mine = st.requested;
        loop {
            if st.covered >= mine {
                return Ok(());
            }
            if st.running {
                st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            st.running = true;
            let target = st.requested;
            drop(st);
            let result = File::open(dir).and_then(|f| f.sync_all());
            st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.running = false;
            st.syncs += 1;
            if result.is_ok() {
                st.covered = st.covered.max(target);
            }
            self.done.notify_all();
            // On failure the others stay uncovered and one of them tries again for itself.
            result?;
        }
    }
}

impl FileStore {
    pub fn new(root: impl Into<PathBuf>) -> FileStore {
        FileStore {
            root: root.into(),
            dir_sync: Arc::default(),
        }
    }

    /// Directory fsyncs run so far (group commit makes this smaller than the number of writes).
    pub fn dir_syncs(&self) -> u64 {
        self.dir_sync
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .syncs
    }

    pub fn threads_dir(&self) -> PathBuf {
        self.root.join("threads")
    }

    /// Removes the temporary files of writes a crash interrupted (`.<stem>.json.<id>.tmp`;
    /// never a thread file, never a symlink's target). Called once at start-up, before any write.
    pub fn sweep_temp_files(&self) -> usize {
        let Ok(entries) = fs::read_dir(self.threads_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let is_tmp = name.starts_with('.') && name.ends_with(".tmp") && name.contains(".json.");
            if is_tmp
                && e.file_type().is_ok_and(|t| t.is_file())
                && fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }

    /// The path of a thread's file.
    pub fn path_of(&self, thread_id: &str) -> Option<PathBuf> {
        file_stem(thread_id).map(|s| self.threads_dir().join(format!("{s}.json")))
    }

    fn ensure_dir(dir: &Path) -> std::io::Result<()> {
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(std::io::Error::other("state path is not a directory")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(parent) = dir.parent() {
                    Self::ensure_dir(parent)?;
                }
                match fs::create_dir(dir) {
                    Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(0o700)),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }
}

impl ThreadStore for FileStore {
    fn load(&self, thread_id: &str) -> Result<Option<ThreadDoc>, StoreError> {
        let path = self
            .path_of(thread_id)
            .ok_or_else(|| StoreError::Invalid("empty thread id".into()))?;
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                // A dangling symlink is "not found" for open(O_NOFOLLOW) only if it does not exist.
                return match fs::symlink_metadata(&path) {
                    Ok(_) => Err(StoreError::Invalid("not a regular file".into())),
                    Err(_) => Ok(None),
                };
            }
            // ELOOP: the final component is a symlink.
            Err(_) => return Err(StoreError::Invalid("cannot open state file".into())),
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(StoreError::Invalid("not a regular file".into()));
        }
        if meta.permissions().mode() & 0o777 != 0o600 {
            let _ = file.set_permissions(fs::Permissions::from_mode(0o600));
        }
        let mut bytes = Vec::with_capacity(meta.len().min(MAX_FILE) as usize);
        file.take(MAX_FILE + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(StoreError::Invalid("state file too large".into()));
        }
        ThreadDoc::from_json(&bytes, thread_id).map(Some)
    }

    fn save(&self, doc: &ThreadDoc) -> Result<(), StoreError> {
        let stem = file_stem(&doc.thread_id)
            .ok_or_else(|| StoreError::Invalid("empty thread id".into()))?;
        let dir = self.threads_dir();
        Self::ensure_dir(&dir)?;
        let target = dir.join(format!("{stem}.json"));
        let tmp = dir.join(format!(
            ".{stem}.json.{}.tmp",
            uuid::Uuid::new_v4().simple()
        ));
        let bytes = doc.to_json();
        let write = || -> std::io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, &target)?;
            self.dir_sync.sync(&dir)?;
            Ok(())
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            StoreError::Io(e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Execution, ThreadDoc};

    #[test]
    fn stems() {
        for (id, stem) in [
            ("thread-1", "thread-1"),
            ("a.b", "a.b"),
            (".hidden", ".hidden"),
            ("com0", "com0"),
            ("Thread-1", "aguiid~5468726561642d31"),
            ("con", "aguiid~636f6e"),
            ("a.", "aguiid~612e"),
            ("中文", "aguiid~e4b8ade69687"),
        ] {
            assert_eq!(file_stem(id).unwrap(), stem, "{id}");
        }
        assert_eq!(
            file_stem(&"A".repeat(96)).unwrap(),
            format!("aguiid~{}", "41".repeat(96))
        );
        assert!(file_stem(&"A".repeat(97)).unwrap().starts_with("aguihash~"));
        // D-19: long verbatim ids use the hex/hash form too.
        assert!(file_stem(&"a".repeat(201))
            .unwrap()
            .starts_with("aguihash~"));
        assert_eq!(file_stem(&"a".repeat(200)).unwrap(), "a".repeat(200));
        assert!(file_stem("").is_none());
    }

    fn doc(thread: &str) -> ThreadDoc {
        ThreadDoc {
            thread_id: thread.into(),
            context_id: "agui-x".into(),
            cwd: "/w".into(),
            user_id: None,
            session_id: None,
            execution: Execution {
                execution_id: "e".into(),
                ros_invocation_id: "r".into(),
                task_id: None,
                pipeline_sequence: 0,
                pipeline_open_steps: Default::default(),
                text_snapshot_digests: Default::default(),
                pending: vec![],
            },
            run_digests: Default::default(),
            applied_resume_digests: Default::default(),
            terminal_execution_ids: Default::default(),
            expired_interrupts: Default::default(),
        }
    }

    #[test]
    fn concurrent_writes_share_directory_fsyncs_and_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::new(dir.path());
        s.save(&doc("warm")).unwrap();
        let n = 64;
        let barrier = std::sync::Barrier::new(n);
        std::thread::scope(|scope| {
            for i in 0..n {
                let (s, barrier) = (&s, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    s.save(&doc(&format!("t{i}"))).unwrap();
                });
            }
        });
        for i in 0..n {
            assert!(s.load(&format!("t{i}")).unwrap().is_some());
        }
        let syncs = s.dir_syncs();
        eprintln!("{} writes, {syncs} directory fsyncs", n + 1);
        assert!(syncs >= 1 && syncs <= n as u64 + 1);
    }

    #[test]
    fn sweep_removes_only_interrupted_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::new(dir.path());
        assert_eq!(s.sweep_temp_files(), 0, "no threads dir yet");
        s.save(&doc("t1")).unwrap();
        let t = s.threads_dir();
        fs::write(t.join(".t1.json.0123abcd.tmp"), b"{partial").unwrap();
        fs::write(t.join(".t2.json.ffff.tmp"), b"").unwrap();
        fs::write(t.join("notes.tmp"), b"x").unwrap();
        std::os::unix::fs::symlink(t.join("t1.json"), t.join(".t3.json.link.tmp")).unwrap();
        assert_eq!(s.sweep_temp_files(), 2);
        let mut left: Vec<String> = fs::read_dir(&t)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".t3.json.link.tmp", "notes.tmp", "t1.json"]);
        assert!(s.load("t1").unwrap().is_some());
    }

    #[test]
    fn save_load_modes_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let s = FileStore::new(&root);
        assert!(s.load("t1").unwrap().is_none());
        s.save(&doc("t1")).unwrap();
        assert_eq!(s.load("t1").unwrap().unwrap(), doc("t1"));
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("threads")), 0o700);
        assert_eq!(mode(&root.join("threads/t1.json")), 0o600);
        // No temp files left.
        assert_eq!(fs::read_dir(root.join("threads")).unwrap().count(), 1);
        // Symlinked file refused.
        let other = dir.path().join("copy.json");
        fs::copy(root.join("threads/t1.json"), &other).unwrap();
        fs::remove_file(root.join("threads/t1.json")).unwrap();
        std::os::unix::fs::symlink(&other, root.join("threads/t1.json")).unwrap();
        assert!(matches!(s.load("t1"), Err(StoreError::Invalid(_))));
        // Foreign thread's document refused.
        fs::remove_file(root.join("threads/t1.json")).unwrap();
        let mut foreign = doc("t2").to_json();
        fs::write(root.join("threads/t1.json"), &mut foreign).unwrap();
        assert!(matches!(s.load("t1"), Err(StoreError::Invalid(_))));
        // A directory in place of the file.
        fs::create_dir(root.join("threads/t3.json")).unwrap();
        assert!(s.load("t3").is_err());
        // A pre-existing root keeps its mode (D-19).
        let pre = dir.path().join("pre");
        fs::create_dir(&pre).unwrap();
        fs::set_permissions(&pre, fs::Permissions::from_mode(0o755)).unwrap();
        FileStore::new(&pre).save(&doc("t1")).unwrap();
        assert_eq!(mode(&pre), 0o755);
    }
}
