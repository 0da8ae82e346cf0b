//! A JSON Web Key Set as the gateway uses it: public signature keys only, each with the one
//! algorithm it verifies. RSA keys verify RS256, P-256 keys ES256, Ed25519 keys EdDSA. A key
//! the gateway cannot use (a symmetric `oct` key, another curve, an encryption key, an `alg`
//! it does not accept, a malformed member) is skipped, never fatal: an identity provider's set
//! often carries such keys next to the ones that sign.

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::Value;

/// The algorithms a token may be signed with.
pub const ACCEPTED: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// The most keys a set may hold (a set is small; a huge one is a mistake or an attack).
pub const MAX_KEYS: usize = 100;

/// The most bytes a key set document may have.
pub const MAX_BYTES: usize = 1 << 20;

/// One usable key.
#[derive(Clone)]
pub struct Key {
    pub kid: Option<String>,
    pub alg: Algorithm,
    pub key: DecodingKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// A key set.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    pub keys: Vec<Key>,
}

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Fails only when the document itself is not
    /// a key set; unusable keys are skipped.
    pub fn parse(bytes: &[u8]) -> Result<KeySet, String> {
        if bytes.len() > MAX_BYTES {
            return Err(format!("the key set is larger than {MAX_BYTES} bytes"));
        }
        let doc: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("the key set is not JSON: {e}"))?;
        let Some(members) = doc.get("keys").and_then(Value::as_array) else {
            return Err("the key set has no \"keys\" array".into());
        };
        let keys: Vec<Key> = members.iter().filter_map(usable).take(MAX_KEYS).collect();
        Ok(KeySet { keys })
    }

    /// The keys that may verify a token signed with `alg` and naming `kid`: the key with that
    /// id, or, for a token naming none, every key of the algorithm.
    pub fn candidates<'a>(
        &'a self,
        alg: Algorithm,
        kid: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Key> + 'a {
        self.keys
            .iter()
            .filter(move |k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid))
    }

    /// Whether the set has a key with this id.
    pub fn knows(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }
}

/// A member of the set as a usable key, or `None`.
fn usable(member: &Value) -> Option<Key> {
    let jwk: Jwk = serde_json::from_value(member.clone()).ok()?;
    if matches!(jwk.common.public_key_use, Some(ref u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let alg = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        // Symmetric keys (never: a public key set must not make a secret), other curves.
        _ => return None,
    };
    let declared = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => return None,
    };
    if declared.is_some_and(|d| d != alg) {
        return None;
    }
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    Some(Key {
        kid: jwk.common.key_id.clone(),
        alg,
        key,
    })
}
