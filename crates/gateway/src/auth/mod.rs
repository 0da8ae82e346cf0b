//! Who is calling, and which threads they may touch.
//!
//! Three ways to authenticate, chosen by configuration (the book's "Authentication"):
//! - none: no token and no key set, only on loopback (one user, whoever reaches the listener);
//! - the service token (`IAC_CODE_AGUI_AUTH_TOKEN`): one trusted caller, typically the app's
//!   server (the CopilotKit runtime), which may act for an end user by naming them in
//!   [`USER_HEADER`]; the header counts only together with the service token;
//! - JWTs (`--auth-jwks`): `Authorization: Bearer <JWT>` verified against the key set (`jwt`,
//!   `keys`, `source`), its user named by a claim.
//!
//! A caller with a user reaches only the threads that user owns ([`Caller::may_touch`]); the
//! checks themselves are in `access`.

pub mod access;

pub use engine::caller::{Caller, Via};
pub mod jwt;
pub mod keys;
pub mod source;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderMap};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::error::{msg, ApiError, Code};
use crate::outbound::Outbound;
use source::{KeySource, Origin};

/// The header by which the service token's caller names the user it acts for.
pub const USER_HEADER: &str = "x-iac-code-user";

/// Why a request was not authenticated: the label of `agui_auth_refusals_total` and the audit
/// line's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No bearer credential.
    Missing,
    /// A bearer that is not the service token, with no key set to check it as a JWT.
    WrongToken,
    /// A JWT refused (why).
    Jwt(jwt::Refusal),
    /// [`USER_HEADER`] without the service token.
    UserHeader,
    /// [`USER_HEADER`] that is not a bounded id.
    BadUserHeader,
}

impl Denied {
    pub fn reason(self) -> &'static str {
        match self {
            Denied::Missing => "missing",
            Denied::WrongToken => "wrong_token",
            Denied::Jwt(r) => r.as_str(),
            Denied::UserHeader => "user_header",
            Denied::BadUserHeader => "bad_user_header",
        }
    }

    /// The JSON error a client gets.
    pub fn error(self) -> ApiError {
        match self {
            Denied::Missing | Denied::WrongToken => {
                ApiError::new(Code::Unauthorized, msg::UNAUTHORIZED)
            }
            Denied::Jwt(jwt::Refusal::Expired) => {
                ApiError::new(Code::Unauthorized, msg::TOKEN_EXPIRED)
            }
            Denied::Jwt(_) => ApiError::new(Code::Unauthorized, msg::TOKEN_INVALID),
            Denied::UserHeader => ApiError::new(Code::Unauthorized, msg::USER_HEADER_NOT_ALLOWED),
            Denied::BadUserHeader => ApiError::new(Code::InvalidInput, msg::ID_USER_HEADER),
        }
    }
}

/// The configured ways to authenticate.
pub struct Auth {
    service_token: Option<String>,
    jwt: Option<(Arc<KeySource>, jwt::Rules)>,
    /// The service token's caller has named a user (the warning of shared kernels is given once).
    named_a_user: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("service_token", &self.service_token.is_some())
            .field(
                "jwks",
                &self.jwt.as_ref().map(|(s, _)| s.origin().to_string()),
            )
            .finish()
    }
}

impl Auth {
    /// The authentication `cfg` configures, its key set read (an error when it cannot be: the
    /// gateway does not start with keys it cannot use).
    /// A key set URL is read with `client`.
    pub async fn open(cfg: &Config, client: &Outbound) -> Result<Auth, String> {
        let jwt = match &cfg.jwt.jwks {
            None => None,
            Some(j) => {
                let origin = Origin::parse(j);
                Some(KeySource::open(origin, source::MIN_INTERVAL, client.clone()).await?)
            }
        };
        Ok(Auth::with_source(cfg, jwt))
    }

    /// [`Auth::open`] without reading: a key set is read by its timer (at once), and until then
    /// every JWT is refused.
    pub fn unread(cfg: &Config, client: &Outbound) -> Auth {
        let jwt = cfg
            .jwt
            .jwks
            .as_deref()
            .map(|j| KeySource::empty(Origin::parse(j), source::MIN_INTERVAL, client.clone()));
        Auth::with_source(cfg, jwt)
    }

    fn with_source(cfg: &Config, source: Option<KeySource>) -> Auth {
        let rules = jwt::Rules {
            issuer: cfg.jwt.issuer.clone(),
            audience: cfg.jwt.audience.clone(),
            user_claim: cfg.jwt.user_claim.clone(),
            ..jwt::Rules::default()
        };
        Auth {
            service_token: cfg.auth_token.clone().filter(|t| !t.is_empty()),
            jwt: source.map(|s| (Arc::new(s), rules)),
            // Users with kernels of their own share nothing to warn of.
            named_a_user: (cfg.isolation.mode == crate::config::isolation::Mode::User).into(),
        }
    }

    /// Starts reading the key set again every `every` (nothing without a key set).
    pub fn spawn_refresh(&self, every: std::time::Duration) -> Option<tokio::task::JoinHandle<()>> {
        self.jwt
            .as_ref()
            .map(|(s, _)| source::spawn_periodic(s.clone(), every))
    }

    /// Whether callers must authenticate.
    pub fn required(&self) -> bool {
        self.service_token.is_some() || self.jwt.is_some()
    }

    /// Who `headers` say is calling, verified.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, Denied> {
        let named = match headers.get(USER_HEADER) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .filter(|u| !u.is_empty() && engine::bounded::is_bounded(u))
                    .ok_or(Denied::BadUserHeader)?,
            ),
        };
        if !self.required() {
            // Nobody to act for: the header counts only with the service token.
            return match named {
                Some(_) => Err(Denied::UserHeader),
                None => Ok(Caller::OPEN),
            };
        }
        let bearer = bearer(headers).ok_or(Denied::Missing)?;
        if let Some(token) = &self.service_token {
            if bool::from(bearer.ct_eq(token.as_bytes())) {
                if named.is_some() && !self.named_a_user.swap(true, Ordering::Relaxed) {
                    shared_kernels_warning("the service token's caller names users");
                }
                return Ok(Caller {
                    via: Via::Service,
                    user: named.map(str::to_owned),
                });
            }
        }
        let Some((source, rules)) = &self.jwt else {
            return Err(Denied::WrongToken);
        };
        let token =
            std::str::from_utf8(bearer).map_err(|_| Denied::Jwt(jwt::Refusal::Malformed))?;
        let user = source
            .verify(token, rules, Instant::now())
            .await
            .map_err(Denied::Jwt)?;
        if named.is_some() {
            return Err(Denied::UserHeader);
        }
        Ok(Caller {
            via: Via::Jwt,
            user: Some(user),
        })
    }

    /// What the gateway says at start-up about how callers authenticate.
    pub fn describe(&self) -> String {
        let jwt = self
            .jwt
            .as_ref()
            .map(|(s, _)| format!("JWTs (keys from {})", s.origin()));
        match (&self.service_token, jwt) {
            (None, None) => "none".into(),
            (Some(_), None) => "the service token".into(),
            (None, Some(j)) => j,
            (Some(_), Some(j)) => format!("the service token and {j}"),
        }
    }
}

/// Says, once, that users who have names still share the kernel processes (`why`: what names
/// them): their tools reach each other's files and more.
pub fn shared_kernels_warning(why: &str) {
    tracing::warn!(
        "{why}, but every user's runs share the kernel processes: one user's agent (its shell and \
         file tools) can read and change other users' workspaces, the credentials their requests \
         carry, their pending approvals, the kernel's system-prompt files and the gateway's state; \
         see the book's \"Authentication and who may touch a thread\""
    );
}

/// The credential of `Authorization: Bearer <credential>` (the scheme in any case).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let bytes = headers.get(header::AUTHORIZATION)?.as_bytes();
    let space = bytes.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = (&bytes[..space], &bytes[space + 1..]);
    scheme.eq_ignore_ascii_case(b"bearer").then_some(rest)
}

#[cfg(test)]
mod tests;
