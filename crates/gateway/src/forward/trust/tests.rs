//! Forward marks: only a valid one counts, and it carries the caller exactly.

use super::*;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn callers() -> Vec<Caller> {
    vec![
        Caller::OPEN,
        Caller {
            via: Via::Service,
            user: None,
        },
        Caller {
            via: Via::Service,
            user: Some("ünïcode user".into()),
        },
        Caller {
            via: Via::Jwt,
            user: Some("alice".into()),
        },
    ]
}

fn keyed(key: &str, caller: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(FORWARDED, "instance-a".parse().unwrap());
    h.insert(FORWARD_KEY, key.parse().unwrap());
    h.insert(CALLER, caller.parse().unwrap());
    h
}

fn db(key: &str) -> Trust<'_> {
    Trust {
        secret: None,
        key: Some(key),
        me: Some("instance-b"),
        now: 1_000,
        auth_required: false,
    }
}

fn signed(caller: &str, to: &str, time: u64, body: &[u8]) -> HeaderMap {
    let digest = body_digest(body);
    let s = Signed {
        method: "POST",
        path: "/",
        body: &digest,
        time,
        from: "instance-a",
        to,
        caller,
    };
    let mut h = HeaderMap::new();
    h.insert(FORWARDED, "instance-a".parse().unwrap());
    for (k, v) in s.headers(SECRET) {
        h.insert(k, v);
    }
    h
}

fn cluster() -> Trust<'static> {
    Trust {
        secret: Some(SECRET),
        key: Some("db-key"),
        me: Some("instance-b"),
        now: 1_000,
        auth_required: false,
    }
}

/// Without a secret: the database's key, and the caller it carries.
#[test]
fn a_keyed_mark_counts_only_with_the_databases_key() {
    let post = Method::POST;
    for c in callers() {
        let h = keyed("k3y", &encode_caller(&c));
        let got = forwarded(&post, "/", &h, db("k3y")).map(|f| f.caller);
        assert_eq!(got, Some(c.clone()));
        assert!(forwarded(&post, "/", &h, db("other")).is_none());
        let no_store = Trust {
            key: None,
            ..db("k3y")
        };
        assert!(!is_forwarded(&post, "/", &h, no_store));
        let mut no_key = h.clone();
        no_key.remove(FORWARD_KEY);
        assert!(!is_forwarded(&post, "/", &no_key, db("k3y")));
    }
    for bad in ["root", "jwt:", "jwt:!!", "service:AAE", "", "open:YQ:x"] {
        assert!(
            forwarded(&post, "/", &keyed("k3y", bad), db("k3y")).is_none(),
            "{bad:?}"
        );
    }
}

/// With a secret: a signature over method, path, body, time, both instances and the caller; the
/// database's key alone counts for nothing.
#[test]
fn a_signed_mark_counts_only_for_its_request_target_and_time() {
    let post = Method::POST;
    for c in callers() {
        let text = encode_caller(&c);
        let h = signed(&text, "instance-b", 1_000, b"{}");
        let f = forwarded(&post, "/", &h, cluster()).unwrap();
        assert_eq!(f.caller, c);
        assert_eq!(f.body_sha256.as_deref(), Some(body_digest(b"{}").as_str()));
    }
    let good = signed("jwt:YWxpY2U", "instance-b", 1_000, b"{}");
    assert!(is_forwarded(&post, "/", &good, cluster()));
    // Another method or path, another target, a time outside the window, another secret.
    assert!(!is_forwarded(&Method::GET, "/", &good, cluster()));
    assert!(!is_forwarded(&post, "/threads/t1", &good, cluster()));
    let elsewhere = signed("jwt:YWxpY2U", "instance-c", 1_000, b"{}");
    assert!(!is_forwarded(&post, "/", &elsewhere, cluster()));
    for t in [1_000 - 31, 1_000 + 31] {
        assert!(!is_forwarded(
            &post,
            "/",
            &signed("open", "instance-b", t, b""),
            cluster()
        ));
    }
    assert!(is_forwarded(
        &post,
        "/",
        &signed("open", "instance-b", 1_029, b""),
        cluster()
    ));
    let other = Trust {
        secret: Some(b"another-secret-another-secret-12"),
        ..cluster()
    };
    assert!(!is_forwarded(&post, "/", &good, other));
    // A changed caller or a changed body digest breaks the signature.
    let mut h = good.clone();
    h.insert(CALLER, "jwt:Ym9i".parse().unwrap());
    assert!(!is_forwarded(&post, "/", &h, cluster()));
    let mut h = good.clone();
    h.insert(BODY, body_digest(b"{\"x\":1}").parse().unwrap());
    assert!(!is_forwarded(&post, "/", &h, cluster()));
    // The database's key is no mark once a secret is configured.
    assert!(!is_forwarded(
        &post,
        "/",
        &keyed("db-key", "open"),
        cluster()
    ));
}

/// Where callers must authenticate, no instance forwards an unauthenticated caller: a mark
/// claiming one (a database reader's forgery with the key) is no mark.
#[test]
fn an_open_caller_is_no_forward_where_authentication_is_required() {
    let post = Method::POST;
    let strict = Trust {
        auth_required: true,
        ..db("k3y")
    };
    assert!(!is_forwarded(&post, "/", &keyed("k3y", "open"), strict));
    assert!(is_forwarded(
        &post,
        "/",
        &keyed("k3y", "jwt:YWxpY2U"),
        strict
    ));
    assert!(is_forwarded(&post, "/", &keyed("k3y", "service"), strict));
}

/// A signed forward counts once within its window; the memory of it is bounded.
#[test]
fn a_signed_forward_counts_once() {
    let seen = Seen::default();
    assert!(seen.first("sig-1", 1_000, 1_000));
    assert!(!seen.first("sig-1", 1_000, 1_005), "replayed");
    assert!(seen.first("sig-2", 1_000, 1_005));
}
