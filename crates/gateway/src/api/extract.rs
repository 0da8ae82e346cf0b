//! What the handlers take from a request before they act, each refusal an answer: the caller
//! ([`Authed`]: a forward's mark, the service token or a JWT; 401), and a POST route's body
//! ([`JsonBody`]: `application/json` (415), within its bound in size (413) and time (408), the
//! body a forward's signature names, a JSON object (400)). A handler takes them in that order,
//! which is the order of the checks.

use crate::error::Respond as _;
use std::marker::PhantomData;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::Response;
use serde_json::{Map, Value};

use super::rules::{BodyRoute, Route};
use super::{header_lang, AppState};
use crate::auth::access::{self, Refused};
use crate::auth::Caller;
use crate::edge::request_body;
use crate::error::{msg, ApiError, Code};
use crate::forward;
use engine::i18n::Lang;

/// The authenticated caller of route `R`, and the language of the request's headers.
pub(super) struct Authed<R> {
    pub hl: Lang,
    pub caller: Caller,
    route: PhantomData<R>,
}

/// The body digest a forward's signature covers (its body must be that one).
#[derive(Clone)]
struct SignedBody(String);

impl<R: Route> FromRequestParts<AppState> for Authed<R> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, Response> {
        let hl = header_lang(&s.cfg, &parts.headers);
        let path = path_and_query(&parts.uri);
        let (caller, signed) =
            authenticate(s, &parts.method, &path, &parts.headers, R::NAME, hl).await?;
        if let Some(digest) = signed {
            parts.extensions.insert(SignedBody(digest));
        }
        Ok(Authed {
            hl,
            caller,
            route: PhantomData,
        })
    }
}

/// Marks `req` as a forward whose signature covers the body of `digest` (a route that reads the
/// request itself, not through [`Authed`]).
pub(super) fn sign(req: &mut Request, digest: String) {
    req.extensions_mut().insert(SignedBody(digest));
}

/// The body of route `R`: its bytes (what a forward passes on) and the JSON object.
pub(super) struct JsonBody<R> {
    pub raw: Bytes,
    pub obj: Map<String, Value>,
    route: PhantomData<R>,
}

impl<R: BodyRoute> FromRequest<AppState> for JsonBody<R> {
    type Rejection = Response;

    async fn from_request(req: Request, s: &AppState) -> Result<Self, Response> {
        let (raw, obj) = json_body(&s.cfg, req, &R::RULES).await?;
        Ok(JsonBody {
            raw,
            obj,
            route: PhantomData,
        })
    }
}

/// The body checks of a POST route after authentication, in order: Content-Type, size and
/// time, the forward's signature, JSON, an object.
#[allow(clippy::result_large_err)]
pub(super) async fn json_body(
    cfg: &crate::config::Config,
    req: Request,
    rules: &super::rules::BodyRules,
) -> Result<(Bytes, Map<String, Value>), Response> {
    let hl = header_lang(cfg, req.headers());
    let err = |code: Code, m: &'static str| Err(ApiError::new(code, m).into_response_in(hl));
    if !is_json(req.headers()) {
        return err(Code::UnsupportedMediaType, msg::UNSUPPORTED_MEDIA_TYPE);
    }
    let signed = req.extensions().get::<SignedBody>().cloned();
    let body = match request_body::read(req, rules.limit).await {
        Ok(b) => b,
        Err(request_body::Unread::TooLarge) => {
            return err(Code::RequestTooLarge, rules.too_large).map_err(closing)
        }
        // A body broken on the way is not JSON; the connection is not reused.
        Err(request_body::Unread::Broken) => {
            return err(Code::InvalidJson, rules.invalid_json).map_err(closing)
        }
        Err(request_body::Unread::Late) => {
            return err(Code::BodyTimeout, msg::BODY_TIMEOUT).map_err(closing)
        }
    };
    // A forward's signature names its body: another body is no forward of it.
    if signed.is_some_and(|d| d.0 != forward::body_digest(&body)) {
        tracing::warn!("a forwarded request's body does not match its signature");
        return err(Code::Unauthorized, msg::UNAUTHORIZED);
    }
    match parse_json(&body) {
        None => err(Code::InvalidJson, rules.invalid_json),
        Some(Value::Object(obj)) => Ok((body, obj)),
        Some(_) => err(Code::InvalidInput, rules.not_object),
    }
}

/// Who is calling ([`crate::auth::Auth::authenticate`]), or the refusal to answer (recorded);
/// with the body digest a forward's signature covers (the route checks the body against it).
#[allow(clippy::result_large_err)]
pub(super) async fn authenticate(
    s: &AppState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    route: &'static str,
    hl: Lang,
) -> Result<(Caller, Option<String>), Response> {
    // Forwarded by another instance: authenticated there.
    let rt = &s.rt;
    if let Some(f) = s.with_trust(|t| forward::forwarded(method, path, headers, t)) {
        // A signed forward counts once: one sent again is no forward (and no client either).
        let fresh = f.signature.as_ref().is_none_or(|(sig, time)| {
            let now = s.with_trust(|t| t.now);
            s.forwarding.seen.first(sig, *time, now)
        });
        if !fresh {
            tracing::warn!("a signed forward was sent again: refused");
            return Err(ApiError::new(Code::Unauthorized, msg::UNAUTHORIZED).into_response_in(hl));
        }
        return Ok((f.caller, f.body_sha256));
    }
    match s.auth.authenticate(headers).await {
        Ok(caller) => Ok((caller, None)),
        Err(denied) => {
            access::record(&**rt.metrics(), route, Refused::Auth(denied), None, None);
            Err(denied.error().into_response_in(hl))
        }
    }
}

/// The request target as a forward signs it: the path and its query.
pub(super) fn path_and_query(uri: &axum::http::Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned())
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
        .unwrap_or(false)
}

/// An error answer after which the connection closes: the rest of the body is not wanted (it is
/// drained within bounds all the same, so that the client reads the answer).
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn parse_json(bytes: &[u8]) -> Option<Value> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    serde_json::from_slice(bytes).ok()
}
