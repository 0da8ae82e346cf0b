//! Keys and tokens for the auth tests: one signing key of each accepted algorithm, generated
//! once per test process, with its public JWK.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::Rules;
use crate::auth::keys::KeySet;

/// A signing key and its public JWK.
pub(crate) struct Signer {
    pub alg: Algorithm,
    pub key: EncodingKey,
    pub jwk: Value,
}

pub(crate) fn rsa() -> &'static Signer {
    static S: OnceLock<Signer> = OnceLock::new();
    S.get_or_init(|| {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        use rsa::traits::PublicKeyParts as _;
        let private = rsa::RsaPrivateKey::new(&mut rand::rngs::OsRng, 2048).unwrap();
        let der = private.to_pkcs1_der().unwrap();
        Signer {
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_der(der.as_bytes()),
            jwk: json!({"kty": "RSA", "kid": "rsa-1", "use": "sig", "alg": "RS256",
                "n": B64.encode(private.n().to_bytes_be()), "e": B64.encode(private.e().to_bytes_be())}),
        }
    })
}

pub(crate) fn ec() -> &'static Signer {
    static S: OnceLock<Signer> = OnceLock::new();
    S.get_or_init(|| {
        use p256::elliptic_curve::sec1::ToEncodedPoint as _;
        use p256::pkcs8::EncodePrivateKey as _;
        let secret = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let point = secret.public_key().to_encoded_point(false);
        Signer {
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(secret.to_pkcs8_der().unwrap().as_bytes()),
            jwk: json!({"kty": "EC", "kid": "ec-1", "crv": "P-256",
                "x": B64.encode(point.x().unwrap()), "y": B64.encode(point.y().unwrap())}),
        }
    })
}

pub(crate) fn ed() -> &'static Signer {
    static S: OnceLock<Signer> = OnceLock::new();
    S.get_or_init(|| {
        use ed25519_dalek::pkcs8::EncodePrivateKey as _;
        let signing = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        Signer {
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(signing.to_pkcs8_der().unwrap().as_bytes()),
            jwk: json!({"kty": "OKP", "kid": "ed-1", "crv": "Ed25519",
                "x": B64.encode(signing.verifying_key().to_bytes())}),
        }
    })
}

pub(crate) fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

pub(crate) fn set(signers: &[&Signer]) -> KeySet {
    let keys: Vec<Value> = signers.iter().map(|s| s.jwk.clone()).collect();
    KeySet::parse(json!({ "keys": keys }).to_string().as_bytes()).unwrap()
}

pub(crate) fn rules() -> Rules {
    Rules {
        issuer: Some("https://idp.example".into()),
        audience: Some("iac-code-agui".into()),
        ..Rules::default()
    }
}

pub(crate) fn claims() -> Value {
    json!({"sub": "alice", "iss": "https://idp.example", "aud": "iac-code-agui",
           "exp": now() + 300, "iat": now()})
}

pub(crate) fn sign(s: &Signer, kid: Option<&str>, claims: &Value) -> String {
    let mut h = Header::new(s.alg);
    h.kid = kid.map(str::to_owned);
    encode(&h, claims, &s.key).unwrap()
}

/// A token with a hand-made header (what no honest library would sign).
pub(crate) fn forged(header: Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string()),
        B64.encode(signature)
    )
}

/// A JWKS document of `signers`' public keys.
pub(crate) fn set_json(signers: &[&Signer]) -> String {
    let keys: Vec<Value> = signers.iter().map(|s| s.jwk.clone()).collect();
    json!({ "keys": keys }).to_string()
}
