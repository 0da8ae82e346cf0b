//! Where the key set comes from, and when it is read again: a JWKS file or an `http(s)://`
//! URL, read at start-up, again when a token names a `kid` the set does not know (at most once
//! per `min_interval`, so a flood of tokens with made-up ids costs one read) and on a timer, so
//! a key rotation needs no restart. A read that fails keeps the set as it was (a rotation
//! half-written or an identity provider down is not a lock-out); the failure is logged.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::jwt::{self, Refusal, Rules};
use super::keys::{KeySet, MAX_BYTES};

/// The shortest time between two reads on unknown key ids.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// A read of a key set URL: connecting, and the whole answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

pub use crate::config::auth::Origin;

/// A key set and where it is read from.
#[derive(Debug)]
pub struct KeySource {
    origin: Origin,
    current: RwLock<Arc<KeySet>>,
    /// When the set was last read (or a read was last tried); `None`: never.
    last_read: Mutex<Option<Instant>>,
    min_interval: Duration,
    /// `None` only when it could not be made (logged): a URL is then never read.
    client: Option<reqwest::Client>,
}

impl KeySource {
    /// Reads the set once: one that cannot be read or is no key set is an error (the gateway
    /// does not start with a key set it cannot use).
    pub async fn open(origin: Origin, min_interval: Duration) -> Result<KeySource, String> {
        let source = KeySource::empty(origin, min_interval);
        let set = source.read().await?;
        *source.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
        *source.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        Ok(source)
    }

    /// A source with no keys yet (every token refused until a read succeeds).
    pub fn empty(origin: Origin, min_interval: Duration) -> KeySource {
        // A redirect may not leave https (the set would then travel in the clear).
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            let downgrade = attempt.previous().iter().any(|u| u.scheme() == "https")
                && attempt.url().scheme() != "https";
            if downgrade || attempt.previous().len() >= 3 {
                attempt.stop()
            } else {
                attempt.follow()
            }
        });
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FETCH_TIMEOUT)
            .redirect(policy)
            .build()
            .inspect_err(|e| tracing::error!(error = %e, "no HTTP client for the JWT key set"))
            .ok();
        KeySource {
            origin,
            current: RwLock::new(Arc::new(KeySet::default())),
            last_read: Mutex::new(None),
            min_interval,
            client,
        }
    }

    /// Where the set is read from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The set as last read.
    pub fn keys(&self) -> Arc<KeySet> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the set again unless it was read less than `min_interval` before `now`. Returns
    /// whether it was read (successfully or not).
    pub async fn refresh(&self, now: Instant) -> bool {
        {
            let mut last = self.last_read.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|l| now.saturating_duration_since(l) < self.min_interval) {
                return false;
            }
            *last = Some(now);
        }
        self.read_again().await;
        true
    }

    /// Reads the set again now (the timer's read: not rate-limited, it paces itself).
    async fn read_again(&self) {
        match self.read().await {
            Ok(set) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the JWT key set could not be read again; the keys read before stay")
            }
        }
    }

    /// Checks `token` (see [`jwt::verify`]); a key id the set does not know makes the set read
    /// again (rate-limited) and the token checked once more.
    pub async fn verify(
        &self,
        token: &str,
        rules: &Rules,
        now: Instant,
    ) -> Result<String, Refusal> {
        match jwt::verify(token, &self.keys(), rules) {
            Err(Refusal::UnknownKey) if self.refresh(now).await => {
                jwt::verify(token, &self.keys(), rules)
            }
            other => other,
        }
    }

    async fn read(&self) -> Result<KeySet, String> {
        match &self.origin {
            Origin::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || read_file(&path))
                    .await
                    .map_err(|e| format!("reading the JWT key set: {e}"))?
            }
            Origin::Url(url) => fetch(self.client.as_ref().ok_or("no HTTP client")?, url)
                .await
                .map_err(|e| format!("{}: {e}", self.origin)),
        }
    }
}

/// Reads `source` again every `every`, until the returned task is aborted.
pub fn spawn_periodic(source: Arc<KeySource>, every: Duration) -> tokio::task::JoinHandle<()> {
    // A zero period would make the timer panic: a millisecond is the least.
    let every = every.max(Duration::from_millis(1));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A source that has never been read is read at once.
        if source
            .last_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            tick.tick().await;
        }
        loop {
            tick.tick().await;
            *source.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            source.read_again().await;
        }
    })
}

fn read_file(path: &Path) -> Result<KeySet, String> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BYTES as u64 + 1).read_to_end(&mut bytes))
        .map_err(|e| format!("cannot read the JWT key set {}: {e}", path.display()))?;
    KeySet::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// Gets a key set from `url`: a 200 answer of at most [`MAX_BYTES`], within the timeouts.
async fn fetch(client: &reqwest::Client, url: &str) -> Result<KeySet, String> {
    let mut answer = client
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("cannot fetch the JWT key set: {}", e.without_url()))?;
    if answer.status() != reqwest::StatusCode::OK {
        return Err(format!("the JWT key set URL answered {}", answer.status()));
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = answer
        .chunk()
        .await
        .map_err(|e| format!("cannot fetch the JWT key set: {}", e.without_url()))?
    {
        if bytes.len() + chunk.len() > MAX_BYTES {
            return Err(format!("the JWT key set is larger than {MAX_BYTES} bytes"));
        }
        bytes.extend_from_slice(&chunk);
    }
    KeySet::parse(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::jwt::tests_support::{claims, ec, ed, rules, set_json, sign};
    use std::path::PathBuf;

    async fn file_source(dir: &Path, set: String, min: Duration) -> (PathBuf, KeySource) {
        let path = dir.join("jwks.json");
        std::fs::write(&path, set).unwrap();
        let source = KeySource::open(Origin::File(path.clone()), min)
            .await
            .unwrap();
        (path, source)
    }

    #[tokio::test]
    async fn an_unknown_kid_reads_the_set_again_at_most_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let (path, source) =
            file_source(dir.path(), set_json(&[ec()]), Duration::from_secs(10)).await;
        let t0 = Instant::now();
        let rotated = sign(ed(), Some("ed-1"), &claims());
        // The key is not published yet: unknown (the read happens, finds nothing).
        assert_eq!(
            source
                .verify(&rotated, &rules(), t0 + Duration::from_secs(11))
                .await,
            Err(Refusal::UnknownKey)
        );
        // Published now, but the last read was just now: not read again yet.
        std::fs::write(&path, set_json(&[ec(), ed()])).unwrap();
        assert_eq!(
            source
                .verify(&rotated, &rules(), t0 + Duration::from_secs(15))
                .await,
            Err(Refusal::UnknownKey)
        );
        // After the interval: read again, the token verifies.
        assert_eq!(
            source
                .verify(&rotated, &rules(), t0 + Duration::from_secs(22))
                .await,
            Ok("alice".into())
        );
        // A known key never causes a read.
        assert!(!source.refresh(t0 + Duration::from_secs(23)).await);
    }

    /// The timer reads a rotated set without any token asking for it.
    #[tokio::test]
    async fn the_timer_reads_a_rotated_set() {
        let dir = tempfile::tempdir().unwrap();
        // The timer is not held back by the rate limit of reads on unknown key ids.
        let (path, source) = file_source(dir.path(), set_json(&[ec()]), MIN_INTERVAL).await;
        let source = Arc::new(source);
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

    #[tokio::test]
    async fn a_failed_read_keeps_the_keys_and_a_bad_first_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let (path, source) = file_source(dir.path(), set_json(&[ec()]), Duration::ZERO).await;
        std::fs::write(&path, "{ half written").unwrap();
        assert!(source.refresh(Instant::now()).await);
        let token = sign(ec(), Some("ec-1"), &claims());
        assert_eq!(
            source.verify(&token, &rules(), Instant::now()).await,
            Ok("alice".into())
        );
        std::fs::remove_file(&path).unwrap();
        assert!(source.refresh(Instant::now()).await);
        assert_eq!(source.keys().keys.len(), 1);
        let origin = Origin::File(path.clone());
        assert!(KeySource::open(origin.clone(), MIN_INTERVAL).await.is_err());
        std::fs::write(&path, vec![b' '; MAX_BYTES + 10]).unwrap();
        assert!(KeySource::open(origin, MIN_INTERVAL).await.is_err());
    }

    /// A key set behind a URL (a local server): read at start, read again on an unknown key id,
    /// and refused when it answers an error, is too large or cannot be reached.
    #[tokio::test]
    async fn a_key_set_url_is_fetched_and_bounded() {
        use axum::routing::get;
        let served = Arc::new(Mutex::new((200u16, set_json(&[ec()]))));
        let s = served.clone();
        let app = axum::Router::new().route(
            "/jwks",
            get(move || {
                let (status, body) = s.lock().unwrap().clone();
                async move { (axum::http::StatusCode::from_u16(status).unwrap(), body) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let source = KeySource::open(Origin::parse(&url), Duration::ZERO)
            .await
            .unwrap();
        assert!(source.keys().knows("ec-1"));
        *served.lock().unwrap() = (200, set_json(&[ec(), ed()]));
        let rotated = sign(ed(), Some("ed-1"), &claims());
        assert_eq!(
            source.verify(&rotated, &rules(), Instant::now()).await,
            Ok("alice".into())
        );
        for (status, body) in [(500, set_json(&[ec()])), (200, " ".repeat(MAX_BYTES + 1))] {
            *served.lock().unwrap() = (status, body);
            let e = KeySource::open(Origin::parse(&url), Duration::ZERO)
                .await
                .unwrap_err();
            assert!(e.contains("500") || e.contains("larger"), "{e}");
            // A running source keeps its keys.
            assert!(source.refresh(Instant::now()).await);
            assert!(source.keys().knows("ed-1"));
        }
        let port = testkit::free_port();
        let gone = Origin::parse(&format!("http://127.0.0.1:{port}/jwks"));
        assert!(KeySource::open(gone, Duration::ZERO).await.is_err());
    }

    #[test]
    fn origins_and_how_they_are_shown() {
        assert_eq!(
            Origin::parse("/etc/agui/jwks.json"),
            Origin::File("/etc/agui/jwks.json".into())
        );
        let u = Origin::parse("HTTPS://idp.example/keys?key=secret");
        assert!(matches!(u, Origin::Url(_)));
        assert_eq!(u.to_string(), "https://idp.example/keys");
        // Neither a user and password nor a query reach a log line, in either form.
        let u = Origin::parse("https://svc:s3cret@idp.internal/jwks?k=1#x");
        assert_eq!(u.to_string(), "https://idp.internal/jwks");
        assert_eq!(format!("{u:?}"), "Origin(https://idp.internal/jwks)");
        let u = Origin::parse("https://token-only@idp.internal/jwks");
        assert_eq!(u.to_string(), "https://idp.internal/jwks");
    }
}
