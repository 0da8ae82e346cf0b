//! The auth unit tests' keys and tokens (`testkit::jwt`), and the gateway's own types built
//! from them.

pub(crate) use testkit::jwt::{claims, ec, ed, forged, now, rsa, set_json, sign, Signer};

use super::Rules;
use crate::auth::keys::KeySet;

pub(crate) fn set(signers: &[&Signer]) -> KeySet {
    KeySet::parse(set_json(signers).as_bytes()).unwrap()
}

pub(crate) fn rules() -> Rules {
    Rules {
        issuer: Some(testkit::jwt::ISSUER.into()),
        audience: Some(testkit::jwt::AUDIENCE.into()),
        ..Rules::default()
    }
}
