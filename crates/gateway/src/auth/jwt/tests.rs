//! Tokens made by the test with keys it generates: one of each accepted algorithm, and every
//! way a token can be wrong.

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine as _;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use super::tests_support::*;
use super::*;

#[test]
fn each_accepted_algorithm_verifies_and_names_its_user() {
    let keys = set(&[rsa(), ec(), ed()]);
    for (s, kid) in [(rsa(), "rsa-1"), (ec(), "ec-1"), (ed(), "ed-1")] {
        assert_eq!(
            verify(&sign(s, Some(kid), &claims()), &keys, &rules()),
            Ok("alice".into()),
            "{kid}"
        );
        // Without a kid: any key of the algorithm.
        assert_eq!(
            verify(&sign(s, None, &claims()), &keys, &rules()),
            Ok("alice".into()),
            "{kid}"
        );
    }
    // Another claim names the user when configured.
    let mut c = claims();
    c["email"] = json!("alice@example.com");
    let r = Rules {
        user_claim: "email".into(),
        ..rules()
    };
    assert_eq!(
        verify(&sign(ec(), Some("ec-1"), &c), &keys, &r),
        Ok("alice@example.com".into())
    );
    // No issuer or audience configured: neither is required.
    let bare = json!({"sub": "bob", "exp": now() + 60});
    assert_eq!(
        verify(&sign(ed(), None, &bare), &keys, &Rules::default()),
        Ok("bob".into())
    );
}

#[test]
fn claims_out_of_bounds_are_refused_by_reason() {
    let keys = set(&[rsa(), ec(), ed()]);
    let check = |edit: &dyn Fn(&mut Value), want: Refusal| {
        let mut c = claims();
        edit(&mut c);
        assert_eq!(
            verify(&sign(ec(), Some("ec-1"), &c), &keys, &rules()),
            Err(want),
            "{c}"
        );
    };
    check(&|c| c["exp"] = json!(now() - 120), Refusal::Expired);
    // Within the leeway (60 s): still valid.
    assert_eq!(
        verify(
            &sign(ec(), Some("ec-1"), &{
                let mut c = claims();
                c["exp"] = json!(now() - 30);
                c
            }),
            &keys,
            &rules()
        ),
        Ok("alice".into())
    );
    check(&|c| c["nbf"] = json!(now() + 600), Refusal::NotYetValid);
    check(
        &|c| c["iss"] = json!("https://evil.example"),
        Refusal::Issuer,
    );
    check(
        &|c| {
            c.as_object_mut().unwrap().remove("iss");
        },
        Refusal::Issuer,
    );
    check(&|c| c["aud"] = json!("someone-else"), Refusal::Audience);
    check(
        &|c| {
            c.as_object_mut().unwrap().remove("aud");
        },
        Refusal::Audience,
    );
    // An audience list that holds ours is ours.
    let mut c = claims();
    c["aud"] = json!(["a", "iac-code-agui"]);
    assert_eq!(
        verify(&sign(rsa(), Some("rsa-1"), &c), &keys, &rules()),
        Ok("alice".into())
    );
    check(
        &|c| {
            c.as_object_mut().unwrap().remove("exp");
        },
        Refusal::Malformed,
    );
    check(
        &|c| {
            c.as_object_mut().unwrap().remove("sub");
        },
        Refusal::User,
    );
    check(&|c| c["sub"] = json!(42), Refusal::User);
    check(&|c| c["sub"] = json!(""), Refusal::User);
    check(&|c| c["sub"] = json!("a\u{0}b"), Refusal::User);
    check(&|c| c["sub"] = json!("x".repeat(300)), Refusal::User);
}

#[test]
fn keys_and_algorithms_that_must_never_verify() {
    let keys = set(&[rsa(), ec()]);
    // A kid the set does not know: the caller may re-read the set.
    assert_eq!(
        verify(&sign(ec(), Some("ec-2"), &claims()), &keys, &rules()),
        Err(Refusal::UnknownKey)
    );
    // A key of the set, but not the one that signed (the kid names the RSA key).
    assert_eq!(
        verify(&sign(ec(), Some("rsa-1"), &claims()), &keys, &rules()),
        Err(Refusal::Signature)
    );
    // An algorithm without a key in the set.
    assert_eq!(
        verify(&sign(ed(), None, &claims()), &keys, &rules()),
        Err(Refusal::Signature)
    );
    // alg none, with or without a signature.
    for sig in [&b""[..], b"x"] {
        let t = forged(json!({"alg": "none", "typ": "JWT"}), &claims(), sig);
        assert_eq!(verify(&t, &keys, &rules()), Err(Refusal::Algorithm), "{t}");
    }
    // The RSA public key used as an HMAC secret (HS256 over the key's own bytes).
    let secret = rsa().jwk["n"].as_str().unwrap().as_bytes().to_vec();
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("rsa-1".into());
    let t = encode(&h, &claims(), &EncodingKey::from_secret(&secret)).unwrap();
    assert_eq!(verify(&t, &keys, &rules()), Err(Refusal::Algorithm));
    // A critical header the gateway does not understand.
    let good = sign(ec(), Some("ec-1"), &claims());
    let sig = B64.decode(good.rsplit('.').next().unwrap()).unwrap();
    let t = forged(
        json!({"alg": "ES256", "kid": "ec-1", "crit": ["exp-ext"], "exp-ext": "x"}),
        &claims(),
        &sig,
    );
    assert_eq!(verify(&t, &keys, &rules()), Err(Refusal::Algorithm));
    // A key carried in the token itself is never used.
    let t = forged(
        json!({"alg": "ES256", "jwk": ed().jwk, "jku": "http://127.0.0.1:9/keys"}),
        &claims(),
        &sig,
    );
    assert_eq!(verify(&t, &keys, &rules()), Err(Refusal::Signature));
    // The claims changed after signing.
    let mut parts: Vec<String> = good.split('.').map(str::to_owned).collect();
    let mut c = claims();
    c["sub"] = json!("mallory");
    parts[1] = B64.encode(c.to_string());
    assert_eq!(
        verify(&parts.join("."), &keys, &rules()),
        Err(Refusal::Signature)
    );
}

#[test]
fn malformed_tokens_of_every_shape_are_refused() {
    let keys = set(&[rsa(), ec(), ed()]);
    let good = sign(ed(), Some("ed-1"), &claims());
    let parts: Vec<&str> = good.split('.').collect();
    let cases = [
        String::new(),
        "abc".into(),
        "a.b".into(),
        "a.b.c.d".into(),
        "..".into(),
        format!("{}..{}", parts[0], parts[2]),
        format!("!!!.{}.{}", parts[1], parts[2]),
        format!("{}.{}.!!!", parts[0], parts[1]),
        format!("{}.{}.{}", B64.encode("not json"), parts[1], parts[2]),
        format!("{}.{}.{}", B64.encode("[1,2]"), parts[1], parts[2]),
        format!("{}.{}.{}", parts[0], B64.encode("not json"), parts[2]),
        format!(
            "{}.{}.{}",
            B64.encode(r#"{"typ":"JWT"}"#),
            parts[1],
            parts[2]
        ),
        format!(
            "{}.{}.{}",
            B64.encode(r#"{"alg":"XX999"}"#),
            parts[1],
            parts[2]
        ),
        format!("{good}="),
        good.replace('.', " "),
    ];
    for t in cases {
        let r = verify(&t, &keys, &rules());
        assert!(
            matches!(
                r,
                Err(Refusal::Malformed | Refusal::Algorithm | Refusal::Signature)
            ),
            "{t:?}: {r:?}"
        );
    }
}

#[test]
fn unusable_keys_are_skipped_and_a_bad_set_refused() {
    let mut members = vec![ec().jwk.clone()];
    members.push(json!({"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"}));
    members.push(json!({"kty": "EC", "kid": "p384", "crv": "P-384", "x": "AA", "y": "AA"}));
    members
        .push(json!({"kty": "RSA", "kid": "enc", "use": "enc", "n": rsa().jwk["n"], "e": "AQAB"}));
    members.push(
        json!({"kty": "RSA", "kid": "wrong-alg", "alg": "RS512", "n": rsa().jwk["n"], "e": "AQAB"}),
    );
    members.push(json!({"kty": "RSA", "kid": "mislabelled", "alg": "ES256", "n": rsa().jwk["n"], "e": "AQAB"}));
    members.push(json!({"kty": "nope"}));
    members.push(json!(17));
    let keys = KeySet::parse(json!({ "keys": members }).to_string().as_bytes()).unwrap();
    let kids: Vec<_> = keys
        .keys
        .iter()
        .map(|k| k.kid.clone().unwrap_or_default())
        .collect();
    assert_eq!(kids, ["ec-1"]);
    // The HMAC member is not a key: a token naming it is refused as an algorithm, not verified.
    let mut h = Header::new(Algorithm::HS256);
    h.kid = Some("hmac".into());
    let t = encode(&h, &claims(), &EncodingKey::from_secret(b"secret")).unwrap();
    assert_eq!(verify(&t, &keys, &rules()), Err(Refusal::Algorithm));
    for bad in [&b"not json"[..], b"{}", b"{\"keys\": 3}", b"[]"] {
        assert!(
            KeySet::parse(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
    assert!(KeySet::parse(&vec![b' '; crate::auth::keys::MAX_BYTES + 1]).is_err());
    // At most MAX_KEYS keys are kept.
    let many: Vec<Value> = (0..150)
        .map(|i| {
            let mut k = ec().jwk.clone();
            k["kid"] = json!(format!("k{i}"));
            k
        })
        .collect();
    let keys = KeySet::parse(json!({ "keys": many }).to_string().as_bytes()).unwrap();
    assert_eq!(keys.keys.len(), crate::auth::keys::MAX_KEYS);
}
