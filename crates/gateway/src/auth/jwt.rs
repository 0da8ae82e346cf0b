//! Checking a bearer JWT: its header names an accepted algorithm (RS256, ES256, EdDSA) and
//! nothing critical the gateway does not understand; its signature verifies with a key of the
//! set (the one its `kid` names, or any of its algorithm when it names none); it is within its
//! `exp`/`nbf` (with a small leeway), from the configured issuer, for the configured audience;
//! and it names a user in the configured claim (default `sub`) that is a bounded id. Keys are
//! never taken from the token (`jwk`, `jku`, `x5u` are ignored), and an HMAC algorithm is
//! refused whatever key it names, so a public key can never be used as a shared secret.

use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use serde_json::Value;
use strum::IntoStaticStr;

use super::keys::{KeySet, ACCEPTED};

/// What a token must satisfy besides its signature.
#[derive(Debug, Clone)]
pub struct Rules {
    /// `iss` must equal this when set.
    pub issuer: Option<String>,
    /// `aud` must contain this when set.
    pub audience: Option<String>,
    /// The claim that names the user.
    pub user_claim: String,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            issuer: None,
            audience: None,
            user_claim: "sub".into(),
            leeway: Duration::from_secs(60),
        }
    }
}

/// Why a token was refused (the label of `agui_auth_refusals_total`, and the log's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq, IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Refusal {
    /// Not a JWT (shape, encoding, JSON).
    Malformed,
    /// Signed with an algorithm the gateway does not accept (`none`, an HMAC, …), or a header
    /// marks as critical something the gateway does not understand.
    Algorithm,
    /// Its `kid` is not in the key set (the set may be re-read, then the token checked again).
    UnknownKey,
    /// No key of the set verifies it.
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// The user claim is missing, not a string, or not a bounded id.
    User,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// The user a valid token names, or why it is refused.
pub fn verify(token: &str, keys: &KeySet, rules: &Rules) -> Result<String, Refusal> {
    // The header is read first (unverified) only to choose the key and the algorithm. An
    // algorithm the library does not know (`none`) is an algorithm refusal, not a malformed
    // token: it is the attack to count.
    if named_algorithm(token).is_some_and(|a| !ACCEPTED.iter().any(|x| format!("{x:?}") == a)) {
        return Err(Refusal::Algorithm);
    }
    let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
        ErrorKind::InvalidAlgorithmName => Refusal::Algorithm,
        _ => Refusal::Malformed,
    })?;
    if !ACCEPTED.contains(&header.alg) || header.crit.is_some() {
        return Err(Refusal::Algorithm);
    }
    if let Some(kid) = &header.kid {
        if !keys.knows(kid) {
            return Err(Refusal::UnknownKey);
        }
    }
    let validation = validation(header.alg, rules);
    let mut refusal = Refusal::Signature;
    for key in keys.candidates(header.alg, header.kid.as_deref()) {
        match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
            Ok(data) => return user(&data.claims, &rules.user_claim),
            Err(e) => {
                refusal = refusal_of(e.kind());
                if refusal != Refusal::Signature {
                    // The signature verified; the claims did not.
                    return Err(refusal);
                }
            }
        }
    }
    Err(refusal)
}

/// The `alg` a token's header names, when its header is a JSON object with a string `alg`.
fn named_algorithm(token: &str) -> Option<String> {
    use base64::Engine as _;
    let head = token.split('.').next()?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(head)
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    v.get("alg")?.as_str().map(str::to_owned)
}

fn validation(alg: Algorithm, rules: &Rules) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = rules.leeway.as_secs();
    v.validate_exp = true;
    v.validate_nbf = true;
    let mut required = vec!["exp"];
    match &rules.issuer {
        Some(iss) => {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        None => v.iss = None,
    }
    match &rules.audience {
        Some(aud) => {
            v.set_audience(&[aud]);
            required.push("aud");
        }
        None => v.validate_aud = false,
    }
    v.set_required_spec_claims(&required);
    v
}

fn refusal_of(kind: &ErrorKind) -> Refusal {
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => Refusal::Signature,
        ErrorKind::ExpiredSignature => Refusal::Expired,
        ErrorKind::ImmatureSignature => Refusal::NotYetValid,
        ErrorKind::InvalidIssuer => Refusal::Issuer,
        ErrorKind::InvalidAudience => Refusal::Audience,
        ErrorKind::MissingRequiredClaim(c) => match c.as_str() {
            "iss" => Refusal::Issuer,
            "aud" => Refusal::Audience,
            _ => Refusal::Malformed,
        },
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Refusal::Algorithm,
        _ => Refusal::Malformed,
    }
}

/// The user the claims name.
fn user(claims: &Value, claim: &str) -> Result<String, Refusal> {
    match claims.get(claim).and_then(Value::as_str) {
        Some(u) if !u.is_empty() && engine::bounded::is_bounded(u) => Ok(u.to_owned()),
        _ => Err(Refusal::User),
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod tests_support;
