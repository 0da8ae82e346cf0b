//! Keys and tokens for the authentication tests: one signing key of each algorithm the gateway
//! accepts (RS256, ES256, EdDSA), generated once per test process, with its public JWK; tokens
//! signed with them, and tokens no honest library would sign.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

/// A signing key and its public JWK.
pub struct Signer {
    pub alg: Algorithm,
    pub key: EncodingKey,
    pub jwk: Value,
}

pub fn rsa() -> &'static Signer {
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

pub fn ec() -> &'static Signer {
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

pub fn ed() -> &'static Signer {
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

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The issuer and audience of [`claims`].
pub const ISSUER: &str = "https://idp.example";
pub const AUDIENCE: &str = "iac-code-agui";

/// Valid claims for `alice` (five minutes left).
pub fn claims() -> Value {
    claims_for("alice")
}

/// Valid claims for `user` (five minutes left).
pub fn claims_for(user: &str) -> Value {
    json!({"sub": user, "iss": ISSUER, "aud": AUDIENCE, "exp": now() + 300, "iat": now()})
}

pub fn sign(s: &Signer, kid: Option<&str>, claims: &Value) -> String {
    let mut h = Header::new(s.alg);
    h.kid = kid.map(str::to_owned);
    encode(&h, claims, &s.key).unwrap()
}

/// A token with a hand-made header (what no honest library would sign).
pub fn forged(header: Value, claims: &Value, signature: &[u8]) -> String {
    format!(
        "{}.{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string()),
        B64.encode(signature)
    )
}

/// A JWKS document of `signers`' public keys.
pub fn set_json(signers: &[&Signer]) -> String {
    let keys: Vec<Value> = signers.iter().map(|s| s.jwk.clone()).collect();
    json!({ "keys": keys }).to_string()
}
