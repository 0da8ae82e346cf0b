//! Filesystem primitives of the store: private directories, no-follow opens, atomic replacement,
//! in-place overwrites and durability (file, directory, whole file system).
//!
//! Nothing here knows about threads or the journal; both build on it.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};

/// Opening flags that never follow a symlink in the last component, never block on a FIFO and
/// never leak into a child process.
const NO_FOLLOW: i32 = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Creates a directory and missing parents, 0700; an existing one is left as it is (a
/// pre-existing state directory keeps the mode its owner gave it).
pub(super) fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(std::io::Error::other("state path is not a directory")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                ensure_dir(parent)?;
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

pub(super) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Flushes every dirty page and inode of the file system holding `f` and waits for it.
#[allow(unsafe_code)]
fn syncfs(f: &File) -> std::io::Result<()> {
    // SAFETY: syncfs takes an open descriptor (borrowed for the call) and has no other
    // preconditions.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Up to this many files are fsynced one by one; above it, one `syncfs` of the file system is
/// cheaper.
const FSYNC_EACH_MAX: usize = 64;

/// Whether `total` files are made durable by `syncfs` rather than one `fsync` each.
fn by_syncfs(total: usize) -> bool {
    total > FSYNC_EACH_MAX
}

/// Makes the given files of each directory (and the directories) durable: one by one, or, when
/// there are more than [`FSYNC_EACH_MAX`] in all, by one `syncfs` of each directory's file
/// system (the second of the same file system finds nothing left to write).
pub(super) fn make_durable(groups: &[(&Path, &HashSet<PathBuf>)]) -> std::io::Result<()> {
    let many = by_syncfs(groups.iter().map(|(_, files)| files.len()).sum());
    for (dir, files) in groups.iter().filter(|(_, files)| !files.is_empty()) {
        if many {
            syncfs(&File::open(dir)?)?;
            continue;
        }
        for f in files.iter() {
            match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(f)
            {
                Ok(h) => h.sync_all()?,
                // Replaced since: the newer file is made durable by whoever wrote it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        sync_dir(dir)?;
    }
    Ok(())
}

/// A directory sync.
type SyncFn = Box<dyn Fn(&Path) -> std::io::Result<()> + Send + Sync>;

/// Group commit of a directory's fsync: one `fsync` of the directory makes every rename done
/// before it started durable, so concurrent writers share it instead of queueing one each.
pub(super) struct DirSync {
    state: Mutex<SyncState>,
    done: Condvar,
    /// The sync itself (a hook for tests, which hold it to show sharing).
    run: SyncFn,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Requests so far (each made after its rename).
    requested: u64,
    /// Requests covered by a completed sync.
    covered: u64,
    running: bool,
    /// Directory syncs run so far.
    syncs: u64,
}

impl Default for DirSync {
    fn default() -> Self {
        DirSync::with(sync_dir)
    }
}

impl std::fmt::Debug for DirSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirSync").finish_non_exhaustive()
    }
}

impl DirSync {
    pub(super) fn with(run: impl Fn(&Path) -> std::io::Result<()> + Send + Sync + 'static) -> Self {
        DirSync {
            state: Mutex::default(),
            done: Condvar::new(),
            run: Box::new(run),
        }
    }

    /// Returns once a sync of `dir` that started after this call has completed (or fails with
    /// the error of the one this caller ran).
    pub(super) fn sync(&self, dir: &Path) -> std::io::Result<()> {
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
            let result = (self.run)(dir);
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

    /// Syncs run so far, and requests made so far.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (u64, u64) {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.syncs, st.requested)
    }
}

/// Replaces `dir/<name>` atomically (temporary file + rename); with a `DirSync`, durably (the
/// file is fsynced before the rename, the directory after).
pub(super) fn replace(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    durable: Option<&DirSync>,
) -> std::io::Result<PathBuf> {
    ensure_dir(dir)?;
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if durable.is_some() {
            f.sync_all()?;
        }
        drop(f);
        fs::rename(&tmp, &target)?;
        if let Some(d) = durable {
            d.sync(dir)?;
        }
        Ok(())
    };
    match write() {
        Ok(()) => Ok(target),
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Writes `dir/<name>` in place (not durable: the caller syncs). An existing regular file is
/// overwritten and cut to length (no new inode, no directory change: creating files at every
/// checkpoint made ext4 scan past ever more recently deleted inodes); a new one is created under
/// its final name; anything else there (a symlink, say) is replaced, never followed.
pub(super) fn overwrite(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    ensure_dir(dir)?;
    let target = dir.join(name);
    let opened = match OpenOptions::new()
        .write(true)
        .custom_flags(NO_FOLLOW)
        .open(&target)
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(NO_FOLLOW)
            .open(&target),
        other => other,
    };
    let (mut f, meta) = match opened.and_then(|f| f.metadata().map(|m| (f, m))) {
        Ok((f, m)) if m.is_file() => (f, m),
        _ => return replace(dir, name, bytes, None),
    };
    if meta.permissions().mode() & 0o777 != 0o600 {
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    f.write_all(bytes)?;
    f.set_len(bytes.len() as u64)?;
    Ok(target)
}

/// How a private file read went.
pub(super) enum Loaded {
    Missing,
    /// Not a regular file we may read (a symlink, a directory, too large, …).
    Refused(&'static str),
    Bytes(Vec<u8>),
}

/// Opens a regular file for reading without following a symlink.
pub(super) fn open_private(path: &Path) -> std::io::Result<fs::File> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(NO_FOLLOW)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Reads a private file without following a symlink, putting its mode back to 0600.
pub(super) fn read_private(path: &Path, max: u64) -> std::io::Result<Loaded> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(NO_FOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A dangling symlink is "not found" to open(O_NOFOLLOW)'s target lookup only if
            // nothing is there at all.
            return Ok(match fs::symlink_metadata(path) {
                Ok(_) => Loaded::Refused("not a regular file"),
                Err(_) => Loaded::Missing,
            });
        }
        // ELOOP: the last component is a symlink.
        Err(_) => return Ok(Loaded::Refused("cannot open state file")),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(Loaded::Refused("not a regular file"));
    }
    if meta.permissions().mode() & 0o777 != 0o600 {
        let _ = file.set_permissions(fs::Permissions::from_mode(0o600));
    }
    let mut bytes = Vec::with_capacity(meta.len().min(max) as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Loaded::Refused("state file too large"));
    }
    Ok(Loaded::Bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    /// Both ways: up to 64 files one `fsync` each (a file replaced since is skipped), more by
    /// one `syncfs` a directory; either way a directory that is gone is an error, not a silent
    /// success.
    #[test]
    fn files_are_made_durable_one_by_one_or_by_syncfs() {
        assert!(!by_syncfs(FSYNC_EACH_MAX));
        assert!(by_syncfs(FSYNC_EACH_MAX + 1));
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        for n in [FSYNC_EACH_MAX, FSYNC_EACH_MAX + 1] {
            let mut groups = Vec::new();
            for d in [&a, &b] {
                std::fs::create_dir_all(d).unwrap();
                let files: HashSet<PathBuf> = (0..n / 2 + n % 2)
                    .map(|i| d.join(format!("{n}-{i}")))
                    .collect();
                for f in &files {
                    std::fs::write(f, b"x").unwrap();
                }
                groups.push((d.as_path(), files));
            }
            let refs: Vec<_> = groups.iter().map(|(d, f)| (*d, f)).collect();
            // One file replaced (gone) since it was written.
            std::fs::remove_file(refs[0].1.iter().next().unwrap()).unwrap();
            make_durable(&refs).unwrap();
            std::fs::remove_dir_all(&b).unwrap();
            let e = make_durable(&refs).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{n} files");
        }
    }

    /// Writers that ask while a sync runs all wait for the next one: however many they are, they
    /// share it.
    #[test]
    fn concurrent_requests_share_one_sync() {
        let hold = Arc::new((Mutex::new(true), Condvar::new()));
        let calls = Arc::new(AtomicU64::new(0));
        let first = Arc::new(AtomicBool::new(true));
        let sync = {
            let (hold, calls, first) = (hold.clone(), calls.clone(), first.clone());
            Arc::new(DirSync::with(move |_| {
                calls.fetch_add(1, Ordering::SeqCst);
                if first.swap(false, Ordering::SeqCst) {
                    // The first sync runs until the test lets it finish.
                    let (m, cv) = &*hold;
                    let mut held = m.lock().unwrap();
                    while *held {
                        held = cv.wait(held).unwrap();
                    }
                }
                Ok(())
            }))
        };
        let dir = Path::new("/");
        std::thread::scope(|scope| {
            let s = sync.clone();
            scope.spawn(move || s.sync(dir).unwrap());
            while calls.load(Ordering::SeqCst) == 0 {
                std::thread::yield_now();
            }
            let waiters = 16;
            for _ in 0..waiters {
                let s = sync.clone();
                scope.spawn(move || s.sync(dir).unwrap());
            }
            while sync.counts().1 < 1 + waiters {
                std::thread::yield_now();
            }
            let (m, cv) = &*hold;
            *m.lock().unwrap() = false;
            cv.notify_all();
        });
        // One sync for the first writer, one shared by the sixteen that asked while it ran.
        assert_eq!(sync.counts(), (2, 17));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failed_sync_is_retried_by_a_waiter_and_reported_to_its_runner() {
        let fail = Arc::new(AtomicBool::new(true));
        let f = fail.clone();
        let sync = DirSync::with(move |_| {
            if f.swap(false, Ordering::SeqCst) {
                Err(std::io::Error::other("disk"))
            } else {
                Ok(())
            }
        });
        assert!(sync.sync(Path::new("/")).is_err());
        assert!(sync.sync(Path::new("/")).is_ok());
        assert_eq!(sync.counts(), (2, 2));
    }
}
