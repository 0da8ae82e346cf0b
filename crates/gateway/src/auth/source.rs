//! Where the key set comes from, and when it is read again: a JWKS file, re-read when a token
//! names a `kid` the set does not know (at most once per `min_interval`, so a flood of tokens
//! with made-up ids costs one read) and on a timer, so a key rotation needs no restart. A read
//! that fails keeps the set as it was (a rotation half-written is not a lock-out); the failure
//! is logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::jwt::{self, Refusal, Rules};
use super::keys::{KeySet, MAX_BYTES};

/// The shortest time between two reads on unknown key ids.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// A key set read from a file.
#[derive(Debug)]
pub struct KeySource {
    path: PathBuf,
    current: RwLock<Arc<KeySet>>,
    /// When the set was last read (or a read was last tried).
    last_read: Mutex<Instant>,
    min_interval: Duration,
}

impl KeySource {
    /// Reads the set once: a file that cannot be read or is no key set is an error (the
    /// gateway does not start with a key set it cannot use).
    pub fn open(path: &Path, min_interval: Duration) -> Result<KeySource, String> {
        let set = read(path)?;
        Ok(KeySource {
            path: path.to_owned(),
            current: RwLock::new(Arc::new(set)),
            last_read: Mutex::new(Instant::now()),
            min_interval,
        })
    }

    /// The set as last read.
    pub fn keys(&self) -> Arc<KeySet> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the set again unless it was read less than `min_interval` before `now`. Returns
    /// whether it was read (successfully or not). Blocking: a small file.
    pub fn refresh(&self, now: Instant) -> bool {
        {
            let mut last = self.last_read.lock().unwrap_or_else(|e| e.into_inner());
            if now.saturating_duration_since(*last) < self.min_interval {
                return false;
            }
            *last = now;
        }
        match read(&self.path) {
            Ok(set) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the JWT key set could not be read again; the keys read before stay")
            }
        }
        true
    }

    /// Checks `token` (see [`jwt::verify`]); a key id the set does not know makes the set read
    /// again (rate-limited) and the token checked once more.
    pub fn verify(&self, token: &str, rules: &Rules, now: Instant) -> Result<String, Refusal> {
        match jwt::verify(token, &self.keys(), rules) {
            Err(Refusal::UnknownKey) if self.refresh(now) => {
                jwt::verify(token, &self.keys(), rules)
            }
            other => other,
        }
    }
}

/// Reads `source` again every `every` (off the runtime's threads), until the returned task is
/// aborted.
pub fn spawn_periodic(source: Arc<KeySource>, every: Duration) -> tokio::task::JoinHandle<()> {
    // A zero period would make the timer panic: a millisecond is the least.
    let every = every.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let s = source.clone();
            let _ = tokio::task::spawn_blocking(move || s.refresh(Instant::now())).await;
        }
    })
}

fn read(path: &Path) -> Result<KeySet, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the JWT key set {}: {e}", path.display()))?;
    KeySet::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::jwt::tests_support::{claims, ec, ed, rules, set_json, sign};

    #[test]
    fn an_unknown_kid_reads_the_set_again_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, set_json(&[ec()])).unwrap();
        let source = KeySource::open(&path, Duration::from_secs(10)).unwrap();
        let t0 = Instant::now();
        let rotated = sign(ed(), Some("ed-1"), &claims());
        // The key is not published yet: unknown (the read happens, finds nothing).
        assert_eq!(
            source.verify(&rotated, &rules(), t0 + Duration::from_secs(11)),
            Err(Refusal::UnknownKey)
        );
        // Published now, but the last read was just now: not read again yet.
        std::fs::write(&path, set_json(&[ec(), ed()])).unwrap();
        assert_eq!(
            source.verify(&rotated, &rules(), t0 + Duration::from_secs(15)),
            Err(Refusal::UnknownKey)
        );
        // After the interval: read again, the token verifies.
        assert_eq!(
            source.verify(&rotated, &rules(), t0 + Duration::from_secs(22)),
            Ok("alice".into())
        );
        // A known key never causes a read.
        assert!(!source.refresh(t0 + Duration::from_secs(23)));
    }

    /// The timer reads a rotated set without any token asking for it.
    #[tokio::test]
    async fn the_timer_reads_a_rotated_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, set_json(&[ec()])).unwrap();
        let source = Arc::new(KeySource::open(&path, Duration::ZERO).unwrap());
        let task = spawn_periodic(source.clone(), Duration::from_millis(50));
        std::fs::write(&path, set_json(&[ed()])).unwrap();
        let start = Instant::now();
        while !source.keys().knows("ed-1") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "never read again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!source.keys().knows("ec-1"), "the rotated-out key is gone");
        task.abort();
    }

    #[test]
    fn a_failed_read_keeps_the_keys_and_a_bad_first_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, set_json(&[ec()])).unwrap();
        let source = KeySource::open(&path, Duration::ZERO).unwrap();
        std::fs::write(&path, "{ half written").unwrap();
        assert!(source.refresh(Instant::now()));
        let token = sign(ec(), Some("ec-1"), &claims());
        assert_eq!(
            source.verify(&token, &rules(), Instant::now()),
            Ok("alice".into())
        );
        std::fs::remove_file(&path).unwrap();
        assert!(source.refresh(Instant::now()));
        assert_eq!(source.keys().keys.len(), 1);
        assert!(KeySource::open(&path, MIN_INTERVAL).is_err());
        std::fs::write(&path, vec![b' '; MAX_BYTES + 10]).unwrap();
        assert!(KeySource::open(&path, MIN_INTERVAL).is_err());
    }
}
