//! The console (`--console`): a page served by the gateway itself at `/console/`, built from
//! `console/` (esbuild) into `crates/gateway/console/`, committed and embedded here, so the
//! binary needs no Node and no file beside it.
//!
//! The page is code, not data: it is served to anyone who may reach the listener (a browser
//! cannot attach a bearer token to a navigation), and every request it makes to the gateway's
//! routes carries the token typed into it, checked as any client's. It talks to nothing but its
//! own origin, which its Content-Security-Policy enforces: no inline script, no eval, no
//! third-party request, no framing.

use std::sync::LazyLock;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use sha2::{Digest, Sha256};

/// What the page may do: its own scripts and styles, calls to its own origin, nothing else.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

const INDEX: &str = include_str!("../console/index.html");
const APP_JS: &[u8] = include_bytes!("../console/app.js");
const APP_JS_GZ: &[u8] = include_bytes!("../console/app.js.gz");
const APP_CSS: &[u8] = include_bytes!("../console/app.css");
const APP_CSS_GZ: &[u8] = include_bytes!("../console/app.css.gz");

/// One file of the page: its bytes (and gzipped, when it is worth it), type and tag. The bytes
/// are shared with every answer, never copied (the script is half a megabyte).
pub struct Asset {
    body: Bytes,
    gzipped: Option<Bytes>,
    mime: &'static str,
    etag: String,
}

impl Asset {
    fn new(body: Bytes, gzipped: Option<&'static [u8]>, mime: &'static str) -> Asset {
        let etag = format!("\"{}\"", hex::encode(&Sha256::digest(&body)[..12]));
        Asset {
            body,
            gzipped: gzipped.map(Bytes::from_static),
            mime,
            etag,
        }
    }
}

/// The console's files, made once: the page carries what the gateway tells it about itself.
pub struct Console {
    index: Asset,
}

static APP_JS_ASSET: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        Bytes::from_static(APP_JS),
        Some(APP_JS_GZ),
        "text/javascript; charset=utf-8",
    )
});
static APP_CSS_ASSET: LazyLock<Asset> = LazyLock::new(|| {
    Asset::new(
        Bytes::from_static(APP_CSS),
        Some(APP_CSS_GZ),
        "text/css; charset=utf-8",
    )
});

impl Console {
    /// The console of a gateway whose callers must (`auth_required`) or need not authenticate
    /// (the page then asks for a token before anything else), on a listener that serves
    /// `/metrics` too (`metrics_here`: the page links it) or not.
    pub fn new(auth_required: bool, metrics_here: bool) -> Console {
        let config = serde_json::json!({
            "auth": if auth_required { "bearer" } else { "none" },
            "metrics": metrics_here,
        })
        .to_string();
        // An attribute value: its quotes escaped (nothing else in it needs to be).
        let index = INDEX.replace("{{CONFIG}}", &config.replace('"', "&quot;"));
        Console {
            index: Asset::new(Bytes::from(index), None, "text/html; charset=utf-8"),
        }
    }

    /// The answer to `method path` under `/console` (`None`: not the console's).
    pub fn answer(&self, method: &Method, path: &str, headers: &HeaderMap) -> Option<Response> {
        let asset = match path {
            "/console" => return Some(redirect()),
            "/console/" | "/console/index.html" => &self.index,
            "/console/app.js" => &APP_JS_ASSET,
            "/console/app.css" => &APP_CSS_ASSET,
            _ => return None,
        };
        if method != Method::GET && method != Method::HEAD {
            return Some(with_allow(plain(StatusCode::METHOD_NOT_ALLOWED)));
        }
        Some(serve(asset, method == Method::HEAD, headers))
    }
}

fn plain(status: StatusCode) -> Response {
    let mut r = Response::new(Body::from(
        status.canonical_reason().unwrap_or("").to_owned(),
    ));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

fn with_allow(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    r
}

/// `/console` → `/console/`, where the page's relative URLs resolve.
fn redirect() -> Response {
    let mut r = plain(StatusCode::PERMANENT_REDIRECT);
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static("/console/"));
    r
}

/// Whether `header` lists `token` (or `*`) in its comma-separated list, not with `q=0`.
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.split(',').any(|item| {
                let mut parts = item.split(';').map(str::trim);
                let t = parts.next().unwrap_or("");
                let refused = parts.any(|p| {
                    p.strip_prefix("q=")
                        .is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0))
                });
                (t == token || t == "*") && !refused
            })
        })
    })
}

fn serve(a: &Asset, head: bool, req: &HeaderMap) -> Response {
    let fresh = lists(req, header::IF_NONE_MATCH, &a.etag);
    let gzip = a
        .gzipped
        .as_ref()
        .filter(|_| lists(req, header::ACCEPT_ENCODING, "gzip"));
    let (status, body) = match (fresh, gzip) {
        (true, _) => (StatusCode::NOT_MODIFIED, Bytes::new()),
        (false, Some(gz)) => (StatusCode::OK, gz.clone()),
        (false, None) => (StatusCode::OK, a.body.clone()),
    };
    let length = body.len();
    let mut r = Response::new(if head || status == StatusCode::NOT_MODIFIED {
        Body::empty()
    } else {
        Body::from(body)
    });
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(a.mime));
    if let Ok(v) = HeaderValue::from_str(&a.etag) {
        h.insert(header::ETAG, v);
    }
    // Asked again each time, answered 304 while unchanged: a new binary's page is never stale.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if status == StatusCode::OK {
        if gzip.is_some() {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(c: &Console, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        c.answer(&Method::GET, path, &h).expect("a console path")
    }

    async fn body(r: Response) -> Vec<u8> {
        axum::body::to_bytes(r.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec()
    }

    #[tokio::test]
    async fn the_page_says_whether_it_must_ask_for_a_token() {
        for (auth, metrics, meta) in [
            (
                true,
                false,
                "{&quot;auth&quot;:&quot;bearer&quot;,&quot;metrics&quot;:false}",
            ),
            (
                false,
                true,
                "{&quot;auth&quot;:&quot;none&quot;,&quot;metrics&quot;:true}",
            ),
        ] {
            let page = get(&Console::new(auth, metrics), "/console/", &[]);
            let html = String::from_utf8(body(page).await).unwrap();
            assert!(html.contains(&format!("content=\"{meta}\"")), "{html}");
            assert!(!html.contains("{{CONFIG}}"));
        }
    }

    #[tokio::test]
    async fn assets_carry_their_type_policy_tag_and_compression() {
        let c = Console::new(false, false);
        let r = get(&c, "/console/app.js", &[]);
        assert_eq!(r.status(), StatusCode::OK);
        let h = r.headers().clone();
        assert_eq!(h[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(h[header::CONTENT_SECURITY_POLICY], CSP);
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert!(h.get(header::CONTENT_ENCODING).is_none());
        assert_eq!(body(r).await, APP_JS);
        let etag = h[header::ETAG].to_str().unwrap().to_owned();
        let refused = get(&c, "/console/app.js", &[("accept-encoding", "gzip;q=0")]);
        assert!(refused.headers().get(header::CONTENT_ENCODING).is_none());
        let gz = get(
            &c,
            "/console/app.js",
            &[("accept-encoding", "br, gzip;q=0.8")],
        );
        assert_eq!(gz.headers()[header::CONTENT_ENCODING], "gzip");
        assert_eq!(gz.headers()[header::ETAG], etag.as_str());
        assert_eq!(body(gz).await, APP_JS_GZ);
        let again = get(&c, "/console/app.js", &[("if-none-match", &etag)]);
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert!(body(again).await.is_empty());
        let other = get(&c, "/console/app.js", &[("if-none-match", "\"x\"")]);
        assert_eq!(other.status(), StatusCode::OK);
        // The HTML is not compressed, and differs with the configuration it carries.
        let page = get(&c, "/console/", &[("accept-encoding", "gzip")]);
        assert!(page.headers().get(header::CONTENT_ENCODING).is_none());
        assert_ne!(
            page.headers()[header::ETAG],
            get(&Console::new(true, false), "/console/", &[]).headers()[header::ETAG]
        );
    }

    #[test]
    fn only_the_consoles_paths_and_methods() {
        let c = Console::new(false, false);
        let h = HeaderMap::new();
        assert!(c.answer(&Method::GET, "/console/x.js", &h).is_none());
        assert!(c.answer(&Method::GET, "/consoles", &h).is_none());
        let r = c.answer(&Method::POST, "/console/", &h).unwrap();
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(r.headers()[header::ALLOW], "GET, HEAD");
        let r = c.answer(&Method::GET, "/console", &h).unwrap();
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(r.headers()[header::LOCATION], "/console/");
        let head = c.answer(&Method::HEAD, "/console/app.css", &h).unwrap();
        assert_eq!(head.status(), StatusCode::OK);
        assert_eq!(
            head.headers()[header::CONTENT_LENGTH],
            APP_CSS.len().to_string().as_str()
        );
    }

    /// What the console adds to the binary stays small (the bound: 1.5 MiB).
    #[test]
    fn the_embedded_console_is_under_a_mebibyte_and_a_half() {
        let total = INDEX.len() + APP_JS.len() + APP_JS_GZ.len() + APP_CSS.len() + APP_CSS_GZ.len();
        assert!(total < 1536 * 1024, "{total} bytes");
    }
}
