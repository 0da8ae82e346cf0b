//! What makes a forwarded request count as one (pure): the mark an instance adds, and how the
//! holder checks it.
//!
//! With a cluster secret (`IAC_CODE_AGUI_CLUSTER_SECRET`), a forward is signed: an HMAC-SHA256
//! over the method, the path, the body's SHA-256, the time, the forwarding and the target
//! instance's ids and the caller. The holder accepts it only within [`WINDOW`] of its time, only
//! when it is the target, and only with the body the signature names; the database is not
//! trusted for anything. Without one, the mark carries the cluster's forward key, which the first
//! instance made in the shared database: a client cannot know it, but whoever can write the
//! database can.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method};
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::FORWARDED;
use crate::auth::{Caller, Via};

/// The cluster's forward key, which makes an unsigned mark count (no cluster secret).
pub const FORWARD_KEY: &str = "x-iac-code-agui-forward-key";
/// The caller as the forwarding instance authenticated it: `open`, `service` or `jwt`, and with a
/// user `:` and the user in base64url (any bytes of a bounded id survive a header).
pub const CALLER: &str = "x-iac-code-agui-caller";
/// A signed forward: the target instance's id, the time (Unix seconds), the body's SHA-256 (hex)
/// and the signature (hex).
pub const TARGET: &str = "x-iac-code-agui-forward-to";
pub const TIME: &str = "x-iac-code-agui-forward-time";
pub const BODY: &str = "x-iac-code-agui-body-sha256";
pub const SIGNATURE: &str = "x-iac-code-agui-forward-signature";

/// How far a signed forward's time may be from the holder's clock.
pub const WINDOW: Duration = Duration::from_secs(30);

/// What the holder trusts.
#[derive(Clone, Copy)]
pub struct Trust<'a> {
    /// The cluster secret: forwards must be signed with it (the database key is not used).
    pub secret: Option<&'a [u8]>,
    /// The database's forward key (used without a secret).
    pub key: Option<&'a str>,
    /// This instance's id (a signed forward must name it).
    pub me: Option<&'a str>,
    /// Now, in Unix seconds.
    pub now: u64,
    /// Callers must authenticate here: no instance forwards a caller without authentication
    /// then, so a mark claiming one is forged.
    pub auth_required: bool,
}

/// A request another instance forwarded: the caller it authenticated, and the body digest the
/// signature covers (the route checks the body it reads against it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    pub caller: Caller,
    pub body_sha256: Option<String>,
    /// A signed forward's signature and time: it counts once (see [`Seen`]).
    pub signature: Option<(String, u64)>,
}

/// The signatures of the signed forwards taken within their window: a forward counts once, so
/// one captured on the way cannot be sent again. Bounded: at most [`Seen::MOST`] are kept (past
/// them, forwards are refused until some leave the window; at 30 s that is thousands a second).
#[derive(Default)]
pub struct Seen(std::sync::Mutex<std::collections::HashMap<String, u64>>);

impl Seen {
    pub const MOST: usize = 100_000;

    /// Whether `signature` (of a forward made at `time`) is new at `now`; it is remembered.
    pub fn first(&self, signature: &str, time: u64, now: u64) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= Self::MOST {
            seen.retain(|_, t| t.abs_diff(now) <= WINDOW.as_secs());
            if seen.len() >= Self::MOST {
                return false;
            }
        }
        seen.insert(signature.to_owned(), time).is_none()
    }
}

/// The SHA-256 of a body, in hex.
pub fn body_digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// The forward `headers` (of `method` on `path`) describe, if they carry a valid mark.
pub fn forwarded(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    trust: Trust<'_>,
) -> Option<Forwarded> {
    let from = headers.get(FORWARDED)?.to_str().ok()?;
    let caller_text = headers.get(CALLER)?.to_str().ok()?;
    let caller = decode_caller(caller_text)?;
    if trust.auth_required && caller.via == Via::Open {
        return None;
    }
    match trust.secret {
        Some(secret) => {
            let text = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
            let (to, time, body, sig) = (text(TARGET)?, text(TIME)?, text(BODY)?, text(SIGNATURE)?);
            if Some(to) != trust.me {
                return None;
            }
            let t: u64 = time.parse().ok()?;
            if t.abs_diff(trust.now) > WINDOW.as_secs() {
                return None;
            }
            let m = Signed {
                method: method.as_str(),
                path,
                body,
                time: t,
                from,
                to,
                caller: caller_text,
            };
            let expected = m.sign(secret);
            let ok: bool = expected.as_bytes().ct_eq(sig.as_bytes()).into();
            ok.then(|| Forwarded {
                caller,
                body_sha256: Some(body.to_owned()),
                signature: Some((sig.to_owned(), t)),
            })
        }
        None => {
            let key = trust.key?;
            let given = headers.get(FORWARD_KEY)?;
            let ok: bool = given.as_bytes().ct_eq(key.as_bytes()).into();
            ok.then_some(Forwarded {
                caller,
                body_sha256: None,
                signature: None,
            })
        }
    }
}

/// Whether `headers` carry a valid forward mark.
pub fn is_forwarded(method: &Method, path: &str, headers: &HeaderMap, trust: Trust<'_>) -> bool {
    forwarded(method, path, headers, trust).is_some()
}

/// Who signs a forward, for whom, and when (Unix seconds).
#[derive(Clone, Copy)]
pub struct At<'a> {
    pub from: &'a str,
    pub to: &'a str,
    pub time: u64,
}

/// The headers that mark a request (`method` on `path` with `body`) as forwarded by `at.from`
/// to `at.to` for `caller`, signed with `secret` (without [`super::FORWARDED`], which names
/// `from` too).
pub fn signed_mark(
    secret: &[u8],
    method: &Method,
    path: &str,
    body: &[u8],
    at: At<'_>,
    caller: &Caller,
) -> Vec<(&'static str, HeaderValue)> {
    let (digest, caller) = (body_digest(body), encode_caller(caller));
    Signed {
        method: method.as_str(),
        path,
        body: &digest,
        time: at.time,
        from: at.from,
        to: at.to,
        caller: &caller,
    }
    .headers(secret)
}

/// The facts a signature covers.
pub(super) struct Signed<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub body: &'a str,
    pub time: u64,
    pub from: &'a str,
    pub to: &'a str,
    pub caller: &'a str,
}

impl Signed<'_> {
    /// HMAC-SHA256 over the facts, one a line (none may hold a line break: ids are bounded, the
    /// path is a request target), in hex.
    pub(super) fn sign(&self, secret: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
        let text = format!(
            "iac-code-agui-forward-v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.method, self.path, self.body, self.time, self.from, self.to, self.caller
        );
        mac.update(text.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// The mark's headers.
    pub(super) fn headers(&self, secret: &[u8]) -> Vec<(&'static str, HeaderValue)> {
        let v = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
        vec![
            (TARGET, v(self.to)),
            (TIME, HeaderValue::from(self.time)),
            (BODY, v(self.body)),
            (CALLER, v(self.caller)),
            (SIGNATURE, v(&self.sign(secret))),
        ]
    }
}

pub(super) fn encode_caller(c: &Caller) -> String {
    let via = match c.via {
        Via::Open => "open",
        Via::Service => "service",
        Via::Jwt => "jwt",
    };
    match &c.user {
        None => via.to_owned(),
        Some(u) => format!("{via}:{}", B64.encode(u.as_bytes())),
    }
}

fn decode_caller(v: &str) -> Option<Caller> {
    let (via, user) = match v.split_once(':') {
        None => (v, None),
        Some((via, u)) => {
            let user = String::from_utf8(B64.decode(u).ok()?).ok()?;
            if user.is_empty() || !engine::bounded::is_bounded(&user) {
                return None;
            }
            (via, Some(user))
        }
    };
    let via = match via {
        "open" => Via::Open,
        "service" => Via::Service,
        "jwt" => Via::Jwt,
        _ => return None,
    };
    Some(Caller { via, user })
}

#[cfg(test)]
mod tests;
