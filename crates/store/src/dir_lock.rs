//! One process per state directory. Two gateways on one directory (a second start while the
//! first still runs, a rolling update on a shared volume) would undo each other: the second
//! removes the first's temporary files, replays and retires its journal while the first still
//! appends to it, and both write the thread files. So the file store takes a lock on
//! `<state-dir>/.lock` at open and keeps it while it is open; a second process is refused at
//! start, naming the process that holds it. It is a POSIX record lock, which the kernel lets go
//! when the process ends however it ends. Such a lock is the process's, and closing any of its
//! descriptors of the file lets it go: so a process opens the file once per directory, and a
//! store opened again in the same process (a restart in tests) shares that lock.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use super::fs::ensure_dir;
use super::StoreError;

/// The lock file's name in the state directory.
pub const LOCK_FILE: &str = ".lock";

/// A held lock: let go when the last store holding it is dropped, or the process ends.
#[derive(Debug)]
pub struct DirLock {
    /// The directory, canonical (its entry in [`HELD`]).
    key: PathBuf,
    /// `None` only while being dropped.
    file: Option<File>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Closed and forgotten under the registry's lock: a `take` meanwhile waits for both, so
        // the close (which lets go of every lock the process has on the file) never comes after
        // a new descriptor's lock.
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.file.take());
        held.retain(|(k, _)| *k != self.key);
    }
}

/// The locks this process holds, by directory.
static HELD: Mutex<Vec<(PathBuf, Weak<DirLock>)>> = Mutex::new(Vec::new());

fn whole_file(kind: i32) -> libc::flock {
    // SAFETY: `flock` is a plain C struct for which all zero bytes are a valid value.
    #[allow(unsafe_code)]
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// Takes the lock of `root` (made if missing), or says which process holds it.
pub fn take(root: &Path) -> Result<Arc<DirLock>, StoreError> {
    ensure_dir(root)?;
    let key = root.canonicalize()?;
    loop {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        match held
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, w)| w.upgrade())
        {
            Some(Some(lock)) => return Ok(lock),
            // Its last holder is dropping it: once it is closed and forgotten, take it anew.
            Some(None) => {
                drop(held);
                std::thread::yield_now();
            }
            None => {
                let file = lock_file(&key)?;
                let lock = Arc::new(DirLock {
                    key: key.clone(),
                    file: Some(file),
                });
                held.push((key, Arc::downgrade(&lock)));
                return Ok(lock);
            }
        }
    }
}

fn lock_file(root: &Path) -> Result<File, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(root.join(LOCK_FILE))?;
    let mut fl = whole_file(libc::F_WRLCK);
    // SAFETY: a valid open descriptor and a valid `flock` for the call.
    #[allow(unsafe_code)]
    let taken = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) } == 0;
    if taken {
        return Ok(file);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EAGAIN) => {
            // SAFETY: as above; F_GETLK fills `fl` with the holder's lock.
            #[allow(unsafe_code)]
            let asked = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) } == 0;
            let who = if asked && fl.l_type != libc::F_UNLCK as libc::c_short {
                format!("another process (pid {})", fl.l_pid)
            } else {
                "another process".to_owned()
            };
            Err(StoreError::Io(std::io::Error::other(format!(
                "{who} uses it: one gateway per state directory (several instances share a \
                 PostgreSQL store, --state-url)"
            ))))
        }
        // A file system without record locks: the rule stands, unchecked.
        Some(libc::ENOLCK) | Some(libc::EOPNOTSUPP) | Some(libc::EINVAL) => {
            tracing::warn!(
                error = %err,
                "the state directory cannot be locked: nothing stops a second gateway using it"
            );
            Ok(file)
        }
        _ => Err(StoreError::Io(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// What another process finds: `python3`'s `lockf` takes the same kind of lock.
    fn other_process_takes(lock_file: &Path) -> bool {
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import fcntl,sys\n\
                 f=open(sys.argv[1],'r+')\n\
                 try:\n    fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB); print('taken')\n\
                 except OSError: print('refused')",
            )
            .arg(lock_file)
            .output()
            .expect("python3");
        match String::from_utf8_lossy(&out.stdout).trim() {
            "taken" => true,
            "refused" => false,
            other => panic!("{other}: {}", String::from_utf8_lossy(&out.stderr)),
        }
    }

    #[test]
    fn another_process_is_refused_while_a_store_holds_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let file = root.join(LOCK_FILE);
        let held = take(&root).unwrap();
        assert!(!other_process_takes(&file));
        // The same process again (a store opened anew): the same lock, and letting go of one
        // keeps the other's.
        let again = take(&dir.path().join("state/../state")).unwrap();
        assert!(Arc::ptr_eq(&held, &again));
        drop(again);
        assert!(!other_process_takes(&file));
        drop(held);
        assert!(other_process_takes(&file));
        // Taken again once free.
        let back = take(&root).unwrap();
        assert!(!other_process_takes(&file));
        drop(back);
    }

    #[test]
    fn a_start_on_a_directory_another_process_holds_is_refused_naming_it() {
        use std::io::{BufRead, BufReader};
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        crate::fs::ensure_dir(&root).unwrap();
        std::fs::write(root.join(LOCK_FILE), b"").unwrap();
        let mut other = Command::new("python3")
            .arg("-c")
            .arg(
                "import fcntl,sys,time\n\
                 f=open(sys.argv[1],'r+')\n\
                 fcntl.lockf(f, fcntl.LOCK_EX|fcntl.LOCK_NB); print('held', flush=True)\n\
                 time.sleep(60)",
            )
            .arg(root.join(LOCK_FILE))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(other.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "held");
        let refused = take(&root).unwrap_err().to_string();
        let _ = other.kill();
        let _ = other.wait();
        assert!(
            refused.contains(&format!("another process (pid {})", other.id())),
            "{refused}"
        );
        assert!(
            refused.contains("one gateway per state directory"),
            "{refused}"
        );
        // Free once that process is gone.
        assert!(take(&root).is_ok());
    }

    /// Whether this process has a POSIX lock on `file` (`/proc/locks`).
    fn locked_here(file: &Path) -> bool {
        use std::os::unix::fs::MetadataExt as _;
        let ino = std::fs::metadata(file).unwrap().ino();
        let me = std::process::id();
        std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .any(|l| {
                l.contains("POSIX")
                    && l.contains(&format!(" {me} "))
                    && l.contains(&format!(":{ino} "))
            })
    }

    #[test]
    fn a_take_while_the_last_holder_drops_it_keeps_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let file = root.join(LOCK_FILE);
        for _ in 0..2000 {
            let a = take(&root).unwrap();
            let dropping = std::thread::spawn(move || drop(a));
            let b = take(&root).unwrap();
            dropping.join().unwrap();
            assert!(locked_here(&file), "the lock went with the other holder");
            drop(b);
        }
        assert!(!locked_here(&file));
    }
}
