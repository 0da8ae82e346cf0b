//! Authentication of a request's headers: the service token, the user it names, JWTs, and every
//! way of getting them wrong.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};

use super::*;
use crate::auth::jwt::tests_support::{claims, ec, ed, rsa, set_json, sign};
use crate::config::{Cli, Config};

fn config(token: Option<&str>, jwks: Option<&std::path::Path>) -> Config {
    let mut c = Config::load(Cli::default(), &|_| None).unwrap();
    c.auth_token = token.map(str::to_owned);
    if let Some(p) = jwks {
        c.jwt.jwks = Some(p.to_string_lossy().into_owned());
        c.jwt.issuer = Some(testkit::jwt::ISSUER.into());
        c.jwt.audience = Some(testkit::jwt::AUDIENCE.into());
    }
    c
}

fn client() -> crate::outbound::Outbound {
    crate::outbound::Outbound::public(&|_| None)
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    h
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

#[tokio::test]
async fn without_authentication_anyone_is_the_one_user() {
    let auth = Auth::open(&config(None, None), &client()).await.unwrap();
    assert!(!auth.required());
    assert_eq!(auth.authenticate(&headers(&[])).await, Ok(Caller::OPEN));
    // A bearer is ignored, as before; a user header is not honoured without the service token.
    let h = headers(&[("authorization", "Bearer x")]);
    assert_eq!(auth.authenticate(&h).await, Ok(Caller::OPEN));
    let h = headers(&[(USER_HEADER, "alice")]);
    assert_eq!(auth.authenticate(&h).await, Err(Denied::UserHeader));
    assert_eq!(auth.describe(), "none");
}

#[tokio::test]
async fn the_service_token_acts_for_the_user_it_names() {
    let auth = Auth::open(&config(Some("s3cret"), None), &client())
        .await
        .unwrap();
    let service = |user: Option<&str>| Caller {
        via: Via::Service,
        user: user.map(str::to_owned),
    };
    let h = headers(&[("authorization", "bearer s3cret")]);
    assert_eq!(auth.authenticate(&h).await, Ok(service(None)));
    let h = headers(&[("authorization", "Bearer s3cret"), (USER_HEADER, "alice")]);
    assert_eq!(auth.authenticate(&h).await, Ok(service(Some("alice"))));
    // The header with a wrong token, or alone: refused before it could count.
    let h = headers(&[("authorization", "Bearer nope"), (USER_HEADER, "alice")]);
    assert_eq!(auth.authenticate(&h).await, Err(Denied::WrongToken));
    let h = headers(&[(USER_HEADER, "alice")]);
    assert_eq!(auth.authenticate(&h).await, Err(Denied::Missing));
    for bad in ["", &"u".repeat(257), "a\u{7}b"] {
        let mut h = headers(&[("authorization", "Bearer s3cret")]);
        if let Ok(v) = HeaderValue::from_str(bad) {
            h.insert(USER_HEADER, v);
            let got = auth.authenticate(&h).await;
            assert_eq!(got, Err(Denied::BadUserHeader), "{bad:?}");
            assert_eq!(Denied::BadUserHeader.error().code, Code::InvalidInput);
        }
    }
    let mut h = headers(&[("authorization", "Bearer s3cret")]);
    h.insert(
        USER_HEADER,
        HeaderValue::from_bytes(b"caf\xc3\xa9\xff").unwrap(),
    );
    assert_eq!(auth.authenticate(&h).await, Err(Denied::BadUserHeader));
    for wrong in [
        "Basic s3cret",
        "Bearer",
        "Bearers3cret",
        "Bearer s3cret ",
        "Bearer S3CRET",
    ] {
        let h = headers(&[("authorization", wrong)]);
        assert!(auth.authenticate(&h).await.is_err(), "{wrong}");
    }
}

#[tokio::test]
async fn a_jwt_names_its_user_and_every_refusal_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, set_json(&[rsa(), ec(), ed()])).unwrap();
    let auth = Auth::open(&config(Some("s3cret"), Some(&path)), &client())
        .await
        .unwrap();
    assert!(auth.describe().starts_with("the service token and JWTs"));
    let user = |t: &str| headers(&[("authorization", &bearer(t))]);
    for s in [rsa(), ec(), ed()] {
        let kid = s.jwk["kid"].as_str().unwrap();
        let got = auth
            .authenticate(&user(&sign(s, Some(kid), &claims())))
            .await;
        assert_eq!(
            got,
            Ok(Caller {
                via: Via::Jwt,
                user: Some("alice".into())
            })
        );
    }
    let mut expired = claims();
    expired["exp"] = (testkit::jwt::now() - 3600).into();
    let got = auth
        .authenticate(&user(&sign(ec(), Some("ec-1"), &expired)))
        .await;
    assert_eq!(got, Err(Denied::Jwt(jwt::Refusal::Expired)));
    assert_eq!(
        Denied::Jwt(jwt::Refusal::Expired).error().message,
        msg::TOKEN_EXPIRED
    );
    let got = auth.authenticate(&user("not.a.jwt")).await;
    assert_eq!(got, Err(Denied::Jwt(jwt::Refusal::Malformed)));
    assert_eq!(
        Denied::Jwt(jwt::Refusal::Malformed).error().message,
        msg::TOKEN_INVALID
    );
    // A JWT user cannot also name someone in the header.
    let mut h = user(&sign(ec(), Some("ec-1"), &claims()));
    h.insert(USER_HEADER, HeaderValue::from_static("bob"));
    assert_eq!(auth.authenticate(&h).await, Err(Denied::UserHeader));
    // The service token still works beside the key set.
    let h = headers(&[("authorization", "Bearer s3cret")]);
    assert_eq!(auth.authenticate(&h).await.unwrap().via, Via::Service);
}

#[tokio::test]
async fn an_unread_key_set_refuses_until_its_timer_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jwks.json");
    std::fs::write(&path, set_json(&[ec()])).unwrap();
    let auth = Auth::unread(&config(None, Some(&path)), &client());
    let h = headers(&[("authorization", &bearer(&sign(ec(), None, &claims())))]);
    assert!(auth.authenticate(&h).await.is_err());
    let _timer = auth.spawn_refresh(Duration::from_secs(3600)).unwrap();
    let start = std::time::Instant::now();
    while auth.authenticate(&h).await.is_err() {
        assert!(start.elapsed() < Duration::from_secs(10), "never read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A key set that cannot be read stops the start.
    std::fs::remove_file(&path).unwrap();
    assert!(Auth::open(&config(None, Some(&path)), &client())
        .await
        .is_err());
}
