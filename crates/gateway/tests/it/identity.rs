//! Who may touch a thread (fake kernel): JWT users and users the service token names each reach
//! only their own threads; to anyone else a thread is one that does not exist, by every route;
//! refusals are JSON errors with their own translated messages, counted and logged as refusals.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Stream};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{
    bearer_for, body, ctx, get_as, guidance_body, jwks_file, metric, permission, post_turn_as,
    resume_body, Builder, TestServer,
};

/// The next turn stops at a permission interrupt.
fn script_interrupt(k: &FakeKernel, thread: &str) {
    let c = ctx(thread);
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .input_required(json!({"input": permission(thread)})),
    );
}

/// The next turn completes.
fn script_done(k: &FakeKernel, thread: &str, task: &str) {
    script_done_in(k, &ctx(thread), task);
}

/// [`script_done`] in the context `c`.
fn script_done_in(k: &FakeKernel, c: &str, task: &str) {
    k.stream(
        Stream::of(task, c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .completed(),
    );
}

/// A gateway that takes JWTs (the test key set, which the returned directory holds) and keeps
/// runs' events for late readers.
async fn jwt_gateway(k: &FakeKernel) -> (TestServer, tempfile::TempDir) {
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    let s = Builder::for_fake(k)
        .config(move |c| c.detach_grace = Duration::from_secs(30))
        .jwks(&jwks, Duration::from_secs(300))
        .start()
        .await;
    (s, keys)
}

async fn get(url: &str, auth: Option<&str>) -> (u16, Value) {
    let h: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
    get_as(url, &h).await
}

fn code(r: &RunResult) -> (u16, Option<&str>, Option<&str>) {
    (r.status, r.error_code(), r.error_message())
}

/// Everything user B can do to user A's interrupted thread `t`, each answered exactly as for a
/// thread that does not exist (`ghost`); none reaches the kernel or changes the thread.
async fn a_stranger_learns_nothing(
    s: &TestServer,
    k: &FakeKernel,
    b: &[(&str, &str)],
    t: &str,
    exec: &str,
) {
    let calls = k.calls("SendStreamingMessage").len() + k.calls("CancelTask").len();
    let before = std::fs::read(s.thread_file(t)).unwrap();
    let (ghost, ws) = ("ghost-thread", s.ws(t));
    // State and events: 404 THREAD_NOT_FOUND, byte for byte the missing thread's answer.
    let mine = get_as(&format!("{}threads/{t}", s.url), b).await;
    assert_eq!(mine, get_as(&format!("{}threads/{ghost}", s.url), b).await);
    assert_eq!(mine.0, 404);
    assert_eq!(mine.1["error"]["code"], "THREAD_NOT_FOUND");
    let events = get_as(&format!("{}threads/{t}/runs/r1/events", s.url), b).await;
    let none = get_as(&format!("{}threads/{ghost}/runs/r1/events", s.url), b).await;
    assert_eq!(events, none);
    assert_eq!(events.1["error"]["code"], "THREAD_NOT_FOUND");
    let history = get_as(&format!("{}threads/{t}/messages", s.url), b).await;
    let nothing = get_as(&format!("{}threads/{ghost}/messages", s.url), b).await;
    assert_eq!(history, nothing);
    assert_eq!(history.1["error"]["code"], "THREAD_NOT_FOUND");
    // Answering A's interrupt (with A's ids): the missing thread's answer.
    let answer = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let resume = post(
        &s.url,
        &resume_body(t, "rb", &ws, "inv-1", answer.clone()),
        b,
    )
    .await;
    let ghostly = post(&s.url, &resume_body(ghost, "rb", &ws, "inv-1", answer), b).await;
    assert_eq!(code(&resume), code(&ghostly));
    assert_eq!(code(&resume).1, Some("EXECUTION_LOST"));
    // A new turn cannot take the id, and says nothing else about it.
    let turn = post_turn_as(&s.url, t, "rb2", "hi", &ws, b).await;
    assert_eq!(turn.status, 409);
    assert_eq!(turn.error_code(), Some("THREAD_ID_TAKEN"));
    // Cancelling A's execution: the missing execution's answer.
    let cancel = json!({"threadId": t, "rosInvocationId": "inv-1"});
    let ghost_cancel = json!({"threadId": ghost, "rosInvocationId": "inv-1"});
    let a = post(&s.cancel_url(exec), &cancel, b).await;
    let g = post(&s.cancel_url(exec), &ghost_cancel, b).await;
    assert_eq!(code(&a), code(&g));
    assert_eq!(a.status, 404);
    // Naming A as the user of a run of one's own.
    let props = json!({"userId": "alice"});
    let named = post(
        &s.url,
        &body("b-own", "rb3", "hi", &s.ws("b-own"), props),
        b,
    )
    .await;
    assert_eq!(named.status, 403);
    assert_eq!(named.error_code(), Some("USER_MISMATCH"));
    assert_eq!(
        named.error_message(),
        Some("iacCode.userId must name the authenticated user.")
    );
    // Nothing reached the kernel; the thread is as it was.
    let after = k.calls("SendStreamingMessage").len() + k.calls("CancelTask").len();
    assert_eq!(after, calls);
    assert_eq!(std::fs::read(s.thread_file(t)).unwrap(), before);
}

/// Two users with JWTs on one gateway: B cannot read, replay, answer, cancel, continue or learn
/// of A's thread; A can do all of it. The thread records its owner; every refusal is counted.
#[tokio::test]
async fn two_users_with_jwts_reach_only_their_own_threads() {
    let k = FakeKernel::start().await;
    let (s, _keys) = jwt_gateway(&k).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    let b = [("authorization", bob.as_str())];
    script_interrupt(&k, "t1");
    let first = post_turn_as(&s.url, "t1", "r1", "hi", &s.ws("t1"), &a).await;
    assert_valid_run(&first, "t1", "r1");
    assert_eq!(first.last()["outcome"]["type"], "interrupt");
    let exec = first.execution_id();
    let doc = s.thread_doc("t1");
    assert_eq!(doc["owner"], "alice");
    // The kernel got the authenticated user.
    let sent = &k.calls("SendStreamingMessage")[0].body;
    assert!(sent.to_string().contains("\"user_id\":\"alice\""), "{sent}");

    a_stranger_learns_nothing(&s, &k, &b, "t1", &exec).await;
    assert!(metric(&s, "agui_auth_refusals_total{reason=\"not_owner\"}") >= 5.0);
    assert_eq!(
        metric(&s, "agui_auth_refusals_total{reason=\"user_mismatch\"}"),
        1.0
    );

    // A reads, replays and cancels.
    let (status, state) = get(&format!("{}threads/t1", s.url), Some(&alice)).await;
    assert_eq!(status, 200);
    assert_eq!(state["binding"]["userId"], "alice");
    assert_eq!(state["pendingInterrupts"][0]["id"], "perm-1");
    let replay = reqwest::Client::new()
        .get(format!("{}threads/t1/runs/r1/events", s.url))
        .header("authorization", &alice)
        .send()
        .await
        .unwrap();
    assert!(
        matches!(replay.status().as_u16(), 200 | 204),
        "{}",
        replay.status()
    );
    let cancel = json!({"threadId": "t1", "rosInvocationId": "inv-1"});
    let cancelled = post(&s.cancel_url(&exec), &cancel, &a).await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.json);
    // A's next turn on the thread is admitted (`userId` omitted or naming A).
    script_done(&k, "t1", "task-2");
    let props = json!({"userId": "alice"});
    let again = post(&s.url, &body("t1", "r2", "again", &s.ws("t1"), props), &a).await;
    assert_valid_run(&again, "t1", "r2");
    assert_eq!(again.last()["type"], "RUN_FINISHED");
}

/// Refusals of authentication: each a 401 JSON error with its own message, translated, with
/// `WWW-Authenticate`, counted by reason; a rotated key set is picked up on its timer.
#[tokio::test]
async fn jwt_refusals_are_specific_and_a_rotated_key_is_found() {
    use testkit::jwt::{claims, ec, ed, forged, rsa, sign};
    let k = FakeKernel::start().await;
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[ec(), rsa()]);
    let s = Builder::for_fake(&k)
        .jwks(&jwks, Duration::from_millis(200))
        .start()
        .await;
    let ask = |auth: String, lang: &'static str| {
        let url = format!("{}threads/none", s.url);
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .header("authorization", auth)
                .header("accept-language", lang)
                .send()
                .await
                .unwrap();
            let www = r.headers().get("www-authenticate").cloned();
            let status = r.status().as_u16();
            let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            (
                status,
                v["error"]["code"].clone(),
                v["error"]["message"].clone(),
                www,
            )
        }
    };
    let mut expired = claims();
    expired["exp"] = (testkit::jwt::now() - 600).into();
    let mut early = claims();
    early["nbf"] = (testkit::jwt::now() + 600).into();
    let mut other_aud = claims();
    other_aud["aud"] = "another-app".into();
    let mut other_iss = claims();
    other_iss["iss"] = "https://evil.example".into();
    let hs = {
        // RS256's public key offered as an HMAC secret.
        let n = rsa().jwk["n"].as_str().unwrap().as_bytes().to_vec();
        let key = jsonwebtoken::EncodingKey::from_secret(&n);
        let h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        jsonwebtoken::encode(&h, &claims(), &key).unwrap()
    };
    let none = forged(json!({"alg": "none", "typ": "JWT"}), &claims(), b"");
    let cases = [
        (
            sign(ec(), Some("ec-1"), &expired),
            "expired",
            "The bearer token has expired.",
        ),
        (
            sign(ec(), Some("ec-1"), &early),
            "not_yet_valid",
            "The bearer token is not valid for this gateway.",
        ),
        (
            sign(ec(), Some("ec-1"), &other_aud),
            "audience",
            "The bearer token is not valid for this gateway.",
        ),
        (
            sign(ec(), Some("ec-1"), &other_iss),
            "issuer",
            "The bearer token is not valid for this gateway.",
        ),
        (
            hs,
            "algorithm",
            "The bearer token is not valid for this gateway.",
        ),
        (
            none,
            "algorithm",
            "The bearer token is not valid for this gateway.",
        ),
        (
            "a.b".to_owned(),
            "malformed",
            "The bearer token is not valid for this gateway.",
        ),
        (
            "x.y.z".to_owned(),
            "malformed",
            "The bearer token is not valid for this gateway.",
        ),
    ];
    for (token, reason, message) in cases {
        let before = metric(
            &s,
            &format!("agui_auth_refusals_total{{reason=\"{reason}\"}}"),
        );
        let (status, code, msg, www) = ask(format!("Bearer {token}"), "en").await;
        assert_eq!(
            (status, code.as_str()),
            (401, Some("UNAUTHORIZED")),
            "{reason}"
        );
        assert_eq!(msg, message, "{reason}");
        assert_eq!(www.unwrap(), "Bearer");
        let after = metric(
            &s,
            &format!("agui_auth_refusals_total{{reason=\"{reason}\"}}"),
        );
        assert_eq!(after, before + 1.0, "{reason}");
    }
    let (_, _, msg, _) = ask(
        format!("Bearer {}", sign(ec(), Some("ec-1"), &expired)),
        "de",
    )
    .await;
    assert_eq!(msg, "Das Bearer-Token ist abgelaufen.");
    let (status, _, msg, _) = ask("Bearer".into(), "en").await;
    assert_eq!(
        (status, msg.as_str()),
        (401, Some("A valid bearer token is required."))
    );
    // A user header beside a JWT is refused: only the service token names users.
    let r = reqwest::Client::new()
        .get(format!("{}threads/none", s.url))
        .header("authorization", bearer_for("alice"))
        .header("x-iac-code-user", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        v["error"]["message"],
        "X-IAC-Code-User is honoured only together with the service token."
    );

    // A key the set does not publish yet: refused; published, it is found without a restart.
    let rotated = format!("Bearer {}", sign(ed(), Some("ed-1"), &claims()));
    let (status, _, _, _) = ask(rotated.clone(), "en").await;
    assert_eq!(status, 401);
    jwks_file(keys.path(), &[ec(), rsa(), ed()]);
    let start = std::time::Instant::now();
    loop {
        let (status, code, _, _) = ask(rotated.clone(), "en").await;
        if status == 404 {
            assert_eq!(code, "THREAD_NOT_FOUND");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the rotated key was never read"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The service token acting for users by `X-IAC-Code-User`: the same isolation; the header
/// without the token is refused; the token acting for nobody reaches every thread (as before).
/// A thread written before owners were recorded belongs to the user it is bound to.
#[tokio::test]
async fn the_service_token_acts_for_the_user_it_names() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).auth("svc-token").start().await;
    let svc = "Bearer svc-token";
    let a = [("authorization", svc), ("x-iac-code-user", "alice")];
    let b = [("authorization", svc), ("x-iac-code-user", "bob")];
    script_interrupt(&k, "t1");
    let first = post_turn_as(&s.url, "t1", "r1", "hi", &s.ws("t1"), &a).await;
    assert_valid_run(&first, "t1", "r1");
    let exec = first.execution_id();
    assert_eq!(s.thread_doc("t1")["owner"], "alice");
    a_stranger_learns_nothing(&s, &k, &b, "t1", &exec).await;
    // The header without the token: refused before anything.
    let as_alice = [("x-iac-code-user", "alice")];
    let r = post_turn_as(&s.url, "t9", "r1", "hi", &s.ws("t9"), &as_alice).await;
    assert_eq!(r.status, 401);
    // The service itself (no user) reaches A's thread.
    assert_eq!(get(&format!("{}threads/t1", s.url), Some(svc)).await.0, 200);
    assert_eq!(
        get(&format!("{}threads/t1", s.url), Some("Bearer wrong"))
            .await
            .0,
        401
    );

    // Written by a caller without a user, bound to `carol`: carol's; bob's is not; a thread bound
    // to nobody is only for callers without a user.
    script_done(&k, "t3", "task-3");
    let carol_props = json!({"userId": "carol"});
    let bound = post(
        &s.url,
        &body("t3", "r1", "hi", &s.ws("t3"), carol_props),
        &[("authorization", svc)],
    )
    .await;
    assert_valid_run(&bound, "t3", "r1");
    assert!(s.thread_doc("t3").get("owner").is_none());
    let carol = [("authorization", svc), ("x-iac-code-user", "carol")];
    let as_carol = |h: &'static str| {
        let url = format!("{}threads/t3", s.url);
        async move {
            reqwest::Client::new()
                .get(url)
                .header("authorization", svc)
                .header("x-iac-code-user", h)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(as_carol("carol").await, 200);
    assert_eq!(as_carol("bob").await, 404);
    script_done(&k, "t3", "task-4");
    let next = post_turn_as(&s.url, "t3", "r2", "hi", &s.ws("t3"), &carol).await;
    assert_valid_run(&next, "t3", "r2");
    assert_eq!(s.thread_doc("t3")["owner"], "carol");
}

/// A stranger's guidance request neither takes nor learns of the owner's guidance places: with
/// the thread's places all taken, the owner is told 429 and the stranger what a missing thread
/// gets.
#[tokio::test]
async fn a_strangers_guidance_takes_no_place_of_the_owners() {
    let k = FakeKernel::start().await;
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    let s = Builder::for_fake(&k)
        .caps(|c| c.max_guidance_per_thread = 1)
        .jwks(&jwks, Duration::from_secs(300))
        .start()
        .await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    script_done(&k, "g1", "task-1");
    let first = post_turn_as(
        &s.url,
        "g1",
        "r1",
        "hi",
        &s.ws("g1"),
        &[("authorization", alice.as_str())],
    )
    .await;
    assert_valid_run(&first, "g1", "r1");
    // The thread's one guidance place, taken (as by a guidance run of the owner's).
    let _held = s.state.rt.limits().guidance("g1").expect("a place");
    let guide = |run: &str| guidance_body("g1", run, "steer", &s.ws("g1"));
    let owners = post(&s.url, &guide("r2"), &[("authorization", alice.as_str())]).await;
    assert_eq!(owners.error_code(), Some("TOO_MANY_GUIDANCE_RUNS"));
    let strangers = post(&s.url, &guide("r3"), &[("authorization", bob.as_str())]).await;
    let ghost = guidance_body("ghost", "r3", "steer", &s.ws("ghost"));
    let missing = post(&s.url, &ghost, &[("authorization", bob.as_str())]).await;
    assert_eq!(code(&strangers), code(&missing));
    assert_eq!(strangers.error_code(), Some("EXECUTION_LOST"));
}

/// A thread deleted and made again by another user shares no runs with its first owner: the
/// first owner's follow stream carries none of the new owner's runs, and the new owner replays
/// none of the first owner's buffered runs (by the events route or a connect's `Last-Event-ID`).
#[tokio::test]
async fn a_thread_made_again_by_another_user_shares_no_runs_with_the_first() {
    use futures_util::StreamExt;
    let k = FakeKernel::start().await;
    let (s, _keys) = jwt_gateway(&k).await;
    let (mallory, alice) = (bearer_for("mallory"), bearer_for("alice"));
    let m = [("authorization", mallory.as_str())];
    let a = [("authorization", alice.as_str())];
    let http = reqwest::Client::new();
    script_done(&k, "x", "task-m");
    let first = post_turn_as(&s.url, "x", "mallorys-run", "hi", &s.ws("xm"), &m).await;
    assert_valid_run(&first, "x", "mallorys-run");
    // Mallory follows the thread, then deletes it.
    let r = http
        .get(format!("{}threads/x/connect?follow=true", s.url))
        .header("authorization", &mallory)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut follow = r.bytes_stream();
    let deleted = http
        .delete(format!("{}threads/x", s.url))
        .header("authorization", &mallory)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    // Alice makes a thread of the same id (its second incarnation), and runs a turn on it.
    script_done_in(&k, &engine::run::incarnation_context_id("x", 1), "task-a");
    let hers = post_turn_as(&s.url, "x", "alices-run", "mine", &s.ws("xa"), &a).await;
    assert_valid_run(&hers, "x", "alices-run");
    let mut seen = String::new();
    let until = tokio::time::Instant::now() + Duration::from_millis(700);
    while let Ok(Some(Ok(chunk))) = tokio::time::timeout_at(until, follow.next()).await {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        seen.contains("MESSAGES_SNAPSHOT"),
        "its own snapshot: {seen}"
    );
    assert!(!seen.contains("alices-run"), "{seen}");
    // Alice replays none of Mallory's run.
    let events = http
        .get(format!("{}threads/x/runs/mallorys-run/events", s.url))
        .header("authorization", &alice)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 404);
    let v: Value = serde_json::from_str(&events.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "RUN_NOT_FOUND", "{v}");
    let r = http
        .get(format!("{}threads/x/connect", s.url))
        .header("authorization", &alice)
        .header("last-event-id", "mallorys-run:0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(!text.contains("mallorys-run"), "{text}");
    assert!(text.contains("MESSAGES_SNAPSHOT"), "{text}");
}

/// A thread document whose owner (and user) was rewritten on disk, by a process that cannot
/// read the owners' key, is refused after a restart: served to nobody (the forger cannot read or
/// connect to it, nor take its id over with a new turn, and the kernel is sent nothing), and a
/// log line names the thread and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_whose_owner_was_forged_on_disk_is_served_to_nobody() {
    use std::process::{Command, Stdio};
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (state, ws) = (dir.path().join("state"), dir.path().join("ws"));
    std::fs::create_dir_all(&ws).unwrap();
    let ws = ws.canonicalize().unwrap();
    let port = crate::support::free_port();
    let url = format!("http://127.0.0.1:{port}/");
    let start = || {
        let mut cmd: Command = crate::support::gateway_command(port, &state);
        cmd.args(["--a2a-url", &k.url()])
            .env("IAC_CODE_AGUI_AUTH_TOKEN", "svc")
            .env("IAC_CODE_AGUI_ALLOWED_CWDS", &ws)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        crate::support::spawn_healthy(&mut cmd, port, Duration::from_secs(20))
    };
    let stop = |child: std::process::Child| {
        #[allow(unsafe_code)]
        // SAFETY: a signal to the child this test started.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let a = [
        ("authorization", "Bearer svc"),
        ("x-iac-code-user", "alice"),
    ];
    let m = [
        ("authorization", "Bearer svc"),
        ("x-iac-code-user", "mallory"),
    ];
    let cwd = ws.join("t-f").display().to_string();

    let gateway = start();
    script_done(&k, "t-f", "task-1");
    let r = post_turn_as(&url, "t-f", "r1", "alice's secret plan", &cwd, &a).await;
    assert_valid_run(&r, "t-f", "r1");
    stop(gateway);
    let file = state.join("threads/t-f.json");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"ownerMac\""), "{text}");
    std::fs::write(&file, text.replace("\"alice\"", "\"mallory\"")).unwrap();

    // Every route answers the state unavailable, to the forger and to alice alike.
    let gateway = start();
    for (route, who) in [("", &m), ("/connect", &m), ("/messages", &m), ("", &a)] {
        let (status, v) = get_as(&format!("{url}threads/t-f{route}"), who).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (503, Some("STATE_UNAVAILABLE")),
            "{route}: {v}"
        );
    }
    let sends = k.calls("SendStreamingMessage").len();
    let taken = post_turn_as(&url, "t-f", "r2", "mine now", &cwd, &m).await;
    assert_eq!(taken.status, 503, "{:?}", taken.json);
    assert_eq!(k.calls("SendStreamingMessage").len(), sends);
    let logs = stop(gateway);
    let refused: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("its seal does not match") && l.contains("t-f"))
        .collect();
    assert_eq!(refused.len(), 1, "logged once: {logs}");
    assert!(std::fs::read_to_string(&file).unwrap().contains("mallory"));
}
