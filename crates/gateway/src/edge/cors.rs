//! Cross-origin requests, for pages served from another origin than the gateway.
//!
//! Off by default: without configured origins no CORS header is ever sent (the behaviour of
//! `iac-code agui`). With origins configured:
//! - a request whose `Origin` is one of them gets it echoed in `Access-Control-Allow-Origin`
//!   (never `*`: the POST routes take a bearer token), with `Vary: Origin`;
//! - a preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) on a route that
//!   takes the token is answered 204 with the allowed methods and headers, before and without authentication (a
//!   browser never sends credentials on a preflight);
//! - any other origin gets no CORS header at all, and its request is judged as before.
//!
//! Hand-written rather than tower-http's `CorsLayer`: that layer answers every preflight and adds
//! its allow-method and allow-header lists whatever the origin, and both are refused here.

use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::response::Response;

/// The request headers a page may send on the POST routes (`Accept-Language` selects the language
/// of error messages; `Last-Event-ID` is what `EventSource` sends when it reconnects).
const ALLOW_HEADERS: &str = "Authorization, Content-Type, Accept, Accept-Language, Last-Event-ID";
const ALLOW_METHODS: &str = "GET, POST, PATCH, DELETE";
/// How long a browser may reuse a preflight answer.
const MAX_AGE: &str = "600";

/// The configured origins, each in its canonical form `scheme://host[:port]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins(Vec<String>);

impl Origins {
    /// Parses a list of configured origins; the first invalid one is the error.
    pub fn parse<S: AsRef<str>>(list: &[S]) -> Result<Origins, String> {
        let mut out: Vec<String> = Vec::with_capacity(list.len());
        for raw in list {
            let o = canonical(raw.as_ref())?;
            if !out.contains(&o) {
                out.push(o);
            }
        }
        Ok(Origins(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// The request's `Origin`, when it is one of the configured origins.
    fn matching<'a>(&self, headers: &'a HeaderMap) -> Option<&'a HeaderValue> {
        let origin = headers.get(header::ORIGIN)?;
        let s = origin.to_str().ok()?;
        self.0
            .iter()
            .any(|o| o.eq_ignore_ascii_case(s))
            .then_some(origin)
    }

    /// The answer to a preflight on a POST route, or `None` when the request is not a preflight of
    /// an allowed origin (it is then judged like any other request).
    pub fn preflight(&self, method: &Method, headers: &HeaderMap) -> Option<Response> {
        if method != Method::OPTIONS || !headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return None;
        }
        let origin = self.matching(headers)?.clone();
        let mut r = Response::new(axum::body::Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOW_METHODS),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(MAX_AGE),
        );
        h.insert(
            header::VARY,
            HeaderValue::from_static(
                "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
            ),
        );
        Some(r)
    }

    /// Decorates an answer: every answer varies by `Origin` (a cache must not serve one origin's
    /// answer, or an answer without CORS headers, to another), and an allowed origin is echoed
    /// (a preflight answer has its headers already).
    pub fn decorate(&self, request: &HeaderMap, response: &mut Response) {
        let h = response.headers_mut();
        let varies = h.get_all(header::VARY).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|p| p.trim().eq_ignore_ascii_case("origin"))
            })
        });
        if !varies {
            h.append(header::VARY, HeaderValue::from_static("Origin"));
        }
        let Some(origin) = self.matching(request) else {
            return;
        };
        if !h.contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        }
    }
}

/// `scheme://host[:port]`, lower-case, without a default port: the form browsers send.
fn canonical(raw: &str) -> Result<String, String> {
    let bad = || {
        format!(
            "--cors-origin must be an origin such as https://app.example.com (scheme, host and \
             optional port; no path, no wildcard): {raw:?}"
        )
    };
    let s = raw.trim();
    let (scheme, rest) = s.split_once("://").ok_or_else(bad)?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return Err(bad()),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() || rest.ends_with(':') || rest.contains(['/', '?', '#', '@', '*', ' ', ','])
    {
        return Err(bad());
    }
    let authority: axum::http::uri::Authority = rest.parse().map_err(|_| bad())?;
    let host = authority.host().to_ascii_lowercase();
    if host.is_empty() {
        return Err(bad());
    }
    // A port that is not a u16 leaves `port()` empty: compare lengths to notice it.
    let has_port = authority.as_str().len() > authority.host().len();
    match (has_port, authority.port_u16()) {
        (false, _) => Ok(format!("{scheme}://{host}")),
        (true, None) => Err(bad()),
        (true, Some(p)) if p.to_string() == default_port => Ok(format!("{scheme}://{host}")),
        (true, Some(p)) => Ok(format!("{scheme}://{host}:{p}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origins(list: &[&str]) -> Origins {
        Origins::parse(list).unwrap()
    }

    fn req(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn origins_are_canonical_and_wildcards_paths_and_other_schemes_are_refused() {
        assert_eq!(
            origins(&[
                "HTTPS://App.Example.com/",
                "http://127.0.0.1:5173",
                "http://a.test:80",
                "https://a.test:443"
            ])
            .as_slice(),
            [
                "https://app.example.com",
                "http://127.0.0.1:5173",
                "http://a.test",
                "https://a.test"
            ]
        );
        assert_eq!(
            origins(&["http://[::1]:8080"]).as_slice(),
            ["http://[::1]:8080"]
        );
        for bad in [
            "*",
            "https://*.example.com",
            "example.com",
            "ftp://example.com",
            "https://example.com/app",
            "https://example.com?x=1",
            "https://user@example.com",
            "https://",
            "https://example.com:",
            "https://example.com:99999",
            "null",
            "",
        ] {
            let e = Origins::parse(&[bad]).unwrap_err();
            assert!(e.contains("--cors-origin"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_preflight_of_an_allowed_origin_is_answered_without_authentication() {
        let o = origins(&["http://page.test:3000"]);
        let h = req(&[
            ("origin", "http://page.test:3000"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization,content-type",
            ),
        ]);
        let r = o.preflight(&Method::OPTIONS, &h).expect("answered");
        assert_eq!(r.status(), StatusCode::NO_CONTENT);
        let g = |k: header::HeaderName| r.headers().get(k).unwrap().to_str().unwrap().to_owned();
        assert_eq!(
            g(header::ACCESS_CONTROL_ALLOW_ORIGIN),
            "http://page.test:3000"
        );
        assert_eq!(
            g(header::ACCESS_CONTROL_ALLOW_METHODS),
            "GET, POST, PATCH, DELETE"
        );
        let allowed = g(header::ACCESS_CONTROL_ALLOW_HEADERS).to_ascii_lowercase();
        for name in ["authorization", "content-type", "accept"] {
            assert!(allowed.split(", ").any(|a| a == name), "{allowed}");
        }
        assert!(g(header::VARY).starts_with("Origin"));
    }

    #[test]
    fn other_origins_and_plain_options_get_nothing() {
        let o = origins(&["http://page.test:3000"]);
        let other_origin = req(&[
            ("origin", "http://evil.test:3000"),
            ("access-control-request-method", "POST"),
        ]);
        let other_port = req(&[
            ("origin", "http://page.test:3001"),
            ("access-control-request-method", "POST"),
        ]);
        let no_origin = req(&[("access-control-request-method", "POST")]);
        // A plain request of the allowed origin is no preflight (it gets its headers later).
        let not_preflight = req(&[("origin", "http://page.test:3000")]);
        for h in [&other_origin, &other_port, &no_origin, &not_preflight] {
            assert!(o.preflight(&Method::OPTIONS, h).is_none(), "{h:?}");
        }
        for h in [&other_origin, &other_port, &no_origin] {
            let mut r = Response::new(axum::body::Body::empty());
            o.decorate(h, &mut r);
            assert!(
                r.headers()
                    .keys()
                    .all(|k| !k.as_str().starts_with("access-control")),
                "{h:?}: {:?}",
                r.headers()
            );
            // Still an answer that varies by origin: no cache hands it to an allowed one.
            assert_eq!(r.headers()[header::VARY], "Origin", "{h:?}");
        }
        let h = req(&[
            ("origin", "http://page.test:3000"),
            ("access-control-request-method", "POST"),
        ]);
        assert!(o.preflight(&Method::POST, &h).is_none());
        assert!(Origins::default().preflight(&Method::OPTIONS, &h).is_none());
    }

    #[test]
    fn an_allowed_origin_is_echoed_never_a_wildcard() {
        let o = origins(&["https://a.test", "https://b.test"]);
        let mut r = Response::new(axum::body::Body::empty());
        r.headers_mut()
            .insert(header::VARY, HeaderValue::from_static("Accept-Language"));
        o.decorate(&req(&[("origin", "https://b.test")]), &mut r);
        assert_eq!(
            r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN],
            "https://b.test"
        );
        let vary: Vec<_> = r.headers().get_all(header::VARY).iter().collect();
        assert_eq!(vary, ["Accept-Language", "Origin"]);
        // An answer that varies by origin already (a preflight's) is not told twice.
        let mut r = Response::new(axum::body::Body::empty());
        r.headers_mut().insert(
            header::VARY,
            HeaderValue::from_static("Origin, Access-Control-Request-Method"),
        );
        o.decorate(&req(&[("origin", "https://b.test")]), &mut r);
        assert_eq!(r.headers().get_all(header::VARY).iter().count(), 1);
    }
}
