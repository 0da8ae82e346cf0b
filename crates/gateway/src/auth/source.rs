//! Where the key set comes from, and when it is read again: a JWKS file or an `http(s)://`
//! URL, read at start-up, again when a token names a `kid` the set does not know (at most once
//! per `min_interval`, so a flood of tokens with made-up ids costs one read) and on a timer, so
//! a key rotation needs no restart. A read that fails keeps the set as it was (a rotation
//! half-written or an identity provider down is not a lock-out); the failure is logged.
//!
//! A URL is read with the gateway's own client ([`Outbound::public`]). Its redirects are followed
//! here, as a browser would but stricter: at most two, never from https to anything else (the set
//! would then travel in the clear); a URL's user and password become basic authentication, not
//! sent on to another host.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use url::Url;

use super::jwt::{self, Refusal, Rules};
use super::keys::{KeySet, MAX_BYTES};
use crate::outbound::Outbound;

/// The shortest time between two reads on unknown key ids.
pub const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// A read of a key set URL, redirects and the whole answer (connecting: the client's 5 s).
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Redirects followed: the answer to a third is the answer.
const MAX_REDIRECTS: usize = 2;

pub use crate::config::auth::Origin;

/// A key set and where it is read from.
#[derive(Debug)]
pub struct KeySource {
    origin: Origin,
    current: RwLock<Arc<KeySet>>,
    /// When the set was last read (or a read was last tried); `None`: never.
    last_read: Mutex<Option<Instant>>,
    min_interval: Duration,
    client: Outbound,
}

impl KeySource {
    /// Reads the set once: one that cannot be read or is no key set is an error (the gateway
    /// does not start with a key set it cannot use).
    pub async fn open(
        origin: Origin,
        min_interval: Duration,
        client: Outbound,
    ) -> Result<KeySource, String> {
        let source = KeySource::empty(origin, min_interval, client);
        let set = source.read().await?;
        *source.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(set);
        *source.last_read.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        Ok(source)
    }

    /// A source with no keys yet (every token refused until a read succeeds); a URL is read with
    /// `client`.
    pub fn empty(origin: Origin, min_interval: Duration, client: Outbound) -> KeySource {
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
            Origin::Url(url) => fetch(&self.client, url)
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

/// Gets a key set from `url`: a 200 answer of at most [`MAX_BYTES`], within [`FETCH_TIMEOUT`].
async fn fetch(client: &Outbound, url: &str) -> Result<KeySet, String> {
    let read = async {
        let answer = get_following(client, url).await?;
        if answer.status() != StatusCode::OK {
            return Err(format!("the JWT key set URL answered {}", answer.status()));
        }
        let mut body = answer.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| format!("cannot fetch the JWT key set: {e}"))?;
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            if bytes.len() + chunk.len() > MAX_BYTES {
                return Err(format!("the JWT key set is larger than {MAX_BYTES} bytes"));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    let bytes = tokio::time::timeout(FETCH_TIMEOUT, read)
        .await
        .map_err(|_| "cannot fetch the JWT key set: timed out".to_owned())??;
    KeySet::parse(&bytes)
}

/// `GET url`, its redirects followed as [`follows`] allows; the answer that is no redirect to
/// follow. No error names a URL (its query may hold a key of the identity provider's).
async fn get_following(
    client: &Outbound,
    url: &str,
) -> Result<Response<hyper::body::Incoming>, String> {
    let mut url = Url::parse(url).map_err(|_| "the JWT key set URL is not a URL".to_owned())?;
    let mut auth = take_credentials(&mut url);
    let mut previous: Vec<Url> = Vec::new();
    loop {
        let mut req = Request::get(url.as_str()).header(header::ACCEPT, "application/json");
        if let Some(auth) = &auth {
            req = req.header(header::AUTHORIZATION, auth.as_str());
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|_| "the JWT key set URL is not a valid request URL".to_owned())?;
        let answer = client
            .send(req)
            .await
            .map_err(|e| format!("cannot fetch the JWT key set: {e}"))?;
        let Some(mut next) = redirect(&answer, &url) else {
            return Ok(answer);
        };
        previous.push(url);
        if !follows(&previous, &next) {
            return Ok(answer);
        }
        // Credentials are for the host they were given for.
        let here = previous.last().expect("just pushed");
        if next.host_str() != here.host_str()
            || next.port_or_known_default() != here.port_or_known_default()
        {
            auth = None;
        }
        let _ = take_credentials(&mut next);
        url = next;
    }
}

/// Where `answer` (to a request for `url`) redirects to: a 301, 302, 303, 307 or 308 with a
/// `Location` (relative to `url`).
fn redirect<B>(answer: &Response<B>, url: &Url) -> Option<Url> {
    let moved = [301, 302, 303, 307, 308].contains(&answer.status().as_u16());
    let location = answer.headers().get(header::LOCATION)?.to_str().ok()?;
    moved.then(|| url.join(location).ok()).flatten()
}

/// Whether a redirect to `next` is followed, after `previous` (the URLs that answered a
/// redirect, this one's last): to http(s), at most [`MAX_REDIRECTS`], and never away from https
/// once there.
fn follows(previous: &[Url], next: &Url) -> bool {
    let downgrade = previous.iter().any(|u| u.scheme() == "https") && next.scheme() != "https";
    let web = matches!(next.scheme(), "http" | "https");
    web && !downgrade && previous.len() <= MAX_REDIRECTS
}

/// Takes a URL's user and password (and fragment) out of it: the `Authorization` of basic
/// authentication they make, if any.
fn take_credentials(url: &mut Url) -> Option<String> {
    use base64::Engine as _;
    url.set_fragment(None);
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    let (user, password) = (decode(url.username()), url.password().map(decode));
    if user.is_empty() && password.is_none() {
        return None;
    }
    let _ = url.set_username("");
    let _ = url.set_password(None);
    let pair = format!("{user}:{}", password.unwrap_or_default());
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::jwt::tests_support::{claims, ec, ed, rules, set_json, sign};
    use std::path::PathBuf;

    fn client() -> Outbound {
        Outbound::public(&|_| None)
    }

    async fn file_source(dir: &Path, set: String, min: Duration) -> (PathBuf, KeySource) {
        let path = dir.join("jwks.json");
        std::fs::write(&path, set).unwrap();
        let source = KeySource::open(Origin::File(path.clone()), min, client())
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
        assert!(KeySource::open(origin.clone(), MIN_INTERVAL, client())
            .await
            .is_err());
        std::fs::write(&path, vec![b' '; MAX_BYTES + 10]).unwrap();
        assert!(KeySource::open(origin, MIN_INTERVAL, client())
            .await
            .is_err());
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
        let source = KeySource::open(Origin::parse(&url), Duration::ZERO, client())
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
            let e = KeySource::open(Origin::parse(&url), Duration::ZERO, client())
                .await
                .unwrap_err();
            assert!(e.contains("500") || e.contains("larger"), "{e}");
            // A running source keeps its keys.
            assert!(source.refresh(Instant::now()).await);
            assert!(source.keys().knows("ed-1"));
        }
        let port = testkit::free_port();
        let gone = Origin::parse(&format!("http://127.0.0.1:{port}/jwks"));
        assert!(KeySource::open(gone, Duration::ZERO, client())
            .await
            .is_err());
    }

    /// Redirects (relative ones too) are followed twice, not a third time; a URL's credentials
    /// go as basic authentication, and not to another host.
    #[tokio::test]
    async fn redirects_and_credentials() {
        use axum::http::HeaderMap;
        use axum::response::Redirect;
        use axum::routing::get;
        let seen = Arc::new(Mutex::new(Vec::<Option<String>>::new()));
        let s = seen.clone();
        let keys = move |h: HeaderMap| {
            let auth = h
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned());
            s.lock().unwrap().push(auth);
            async move { set_json(&[ec()]) }
        };
        let elsewhere = |h: HeaderMap| async move {
            let host = h.get("host").unwrap().to_str().unwrap();
            let port = host.rsplit(':').next().unwrap();
            Redirect::temporary(&format!("http://localhost:{port}/jwks"))
        };
        let app = axum::Router::new()
            .route("/jwks", get(keys))
            .route("/r1", get(|| async { Redirect::temporary("jwks") }))
            .route("/r2", get(|| async { Redirect::to("/r1") }))
            .route("/r3", get(|| async { Redirect::permanent("/r2") }))
            .route("/elsewhere", get(elsewhere));
        let addr = testkit::serve(app).await;
        let open = |url: String| KeySource::open(Origin::parse(&url), Duration::ZERO, client());
        let source = open(format!("http://{addr}/r2")).await.unwrap();
        assert!(source.keys().knows("ec-1"));
        let e = open(format!("http://{addr}/r3")).await.unwrap_err();
        assert!(e.contains("answered 307"), "{e}");
        let source = open(format!("http://svc:s%33cret@{addr}/jwks#k")).await;
        assert!(source.is_ok());
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD.encode("svc:s3cret");
        assert_eq!(
            seen.lock().unwrap().last().unwrap().as_deref(),
            Some(format!("Basic {basic}").as_str())
        );
        let count = seen.lock().unwrap().len();
        assert!(open(format!("http://svc:s3cret@{addr}/elsewhere"))
            .await
            .is_ok());
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), count + 1, "the other host was asked");
        assert_eq!(seen.last().unwrap(), &None);
    }

    #[test]
    fn a_redirect_never_leaves_https() {
        let u = |s: &str| Url::parse(s).unwrap();
        let (http, https) = (u("http://127.0.0.1/a"), u("https://idp.example/a"));
        assert!(follows(&[u("http://127.0.0.1/")], &https));
        assert!(follows(
            &[u("https://idp.example/")],
            &u("https://other.example/b")
        ));
        assert!(!follows(&[u("https://idp.example/")], &http));
        assert!(!follows(&[https, u("https://x.example/")], &http));
        assert!(!follows(
            &[u("https://idp.example/")],
            &u("ftp://idp.example/a")
        ));
        // Two redirects followed, not a third.
        assert!(follows(&[u("http://a/"), u("http://b/")], &http));
        assert!(!follows(
            &[u("http://a/"), u("http://b/"), u("http://c/")],
            &http
        ));
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
