//! Threads that belong to their user across two instances on one PostgreSQL: whichever instance
//! a user asks, another user's thread is one that does not exist, and the owner's requests reach
//! the holder. The holder authenticates a forwarded request itself, from the client's own
//! credentials: a forward mark or a user header a client adds decides nothing.

use serde_json::json;
use testkit::fake_kernel::{FakeKernel, Stream};
use testkit::postgres::Cluster;
use testkit::sse::{assert_valid_run, post};

use crate::cluster::{accepting_resume, allow, interrupting_turn, row, Instance, Workspace};
use crate::support::{bearer_for, body, get_as, jwks_file, post_turn_as, resume_body};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_thread_is_theirs_on_every_instance() {
    let pg = Cluster::start();
    let db = pg.create_db("identity");
    let ws = Workspace::new();
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let mut env = ws.env();
    env.push(("IAC_CODE_AGUI_AUTH_TOKEN".into(), "svc".into()));
    let jwt_args = |k: &FakeKernel| {
        vec![
            "--a2a-url".to_owned(),
            k.url(),
            "--auth-jwks".into(),
            jwks.display().to_string(),
            "--auth-issuer".into(),
            testkit::jwt::ISSUER.into(),
            "--auth-audience".into(),
            testkit::jwt::AUDIENCE.into(),
        ]
    };
    let start = |k: &FakeKernel| {
        let args = jwt_args(k);
        Instance::start(
            &db,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            &env,
        )
    };
    let (a, b) = (start(&ka), start(&kb));
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let al = [("authorization", alice.as_str())];
    let bo = [("authorization", bob.as_str())];

    // Alice's thread, held by A, waiting for her permission.
    interrupting_turn(&ka, "t1", "task-1", "perm-1");
    let first = post_turn_as(&a.url(), "t1", "r1", "hi", &ws.cwd("t1"), &al).await;
    assert_valid_run(&first, "t1", "r1");
    assert_eq!(first.last()["outcome"]["type"], "interrupt");
    let exec = first.execution_id();
    let (_, _, doc) = row(&pg, "identity", "t1");
    assert_eq!(doc["owner"], "alice");
    let owner = pg.psql(
        "identity",
        "SELECT owner_user FROM agui_threads WHERE thread_id = 't1'",
    );
    assert_eq!(owner.trim(), "alice");
    // Which instance holds her thread is hers to read; `/health` names the instance that answers
    // to the operator (the service token) only, as the rest of what the process is.
    let held = get_as(&format!("{}threads/t1", b.url()), &al).await;
    assert_eq!(
        held.1["heldBy"],
        row(&pg, "identity", "t1").0.as_str(),
        "{held:?}"
    );
    for h in [&[][..], &al[..]] {
        let (_, v) = get_as(&format!("{}health", a.url()), h).await;
        assert!(v.get("instance").is_none(), "{v}");
    }
    let (_, op) = get_as(
        &format!("{}health", a.url()),
        &[("authorization", "Bearer svc")],
    )
    .await;
    assert_eq!(op["instance"], held.1["heldBy"], "{op}");

    // Bob, at either instance, by every route, with his JWT or as the service acting for him,
    // and with a forward mark of his own making (no mark without the cluster's key: his request
    // is authenticated and forwarded as any other): what a missing thread gets.
    let svc_bob = [("authorization", "Bearer svc"), ("x-iac-code-user", "bob")];
    let marked = [
        ("authorization", bob.as_str()),
        ("x-iac-code-agui-forwarded-by", "someone"),
    ];
    let sends = ka.calls("SendStreamingMessage").len();
    for (who, h) in [
        ("jwt", &bo[..]),
        ("service", &svc_bob[..]),
        ("marked", &marked[..]),
    ] {
        for inst in [&a, &b] {
            let url = inst.url();
            let state = get_as(&format!("{url}threads/t1"), h).await;
            let ghost = get_as(&format!("{url}threads/ghost"), h).await;
            assert_eq!(state, ghost, "{who} at {url}");
            assert_eq!(state.1["error"]["code"], "THREAD_NOT_FOUND");
            let events = get_as(&format!("{url}threads/t1/runs/r1/events"), h).await;
            assert_eq!(
                events.1["error"]["code"], "THREAD_NOT_FOUND",
                "{who} at {url}"
            );
            let history = get_as(&format!("{url}threads/t1/messages"), h).await;
            assert_eq!(
                history.1["error"]["code"], "THREAD_NOT_FOUND",
                "{who} at {url}"
            );
            let (status, list) = get_as(&format!("{url}threads"), h).await;
            assert_eq!(
                (status, &list["threads"]),
                (200, &json!([])),
                "{who} at {url}"
            );
            let resume = resume_body("t1", "rb", &ws.cwd("t1"), "inv-1", allow("perm-1"));
            let r = post(&url, &resume, h).await;
            assert_eq!(
                r.error_code(),
                Some("EXECUTION_LOST"),
                "{who} at {url}: {:?}",
                r.json
            );
            let turn = post_turn_as(&url, "t1", "rb2", "hi", &ws.cwd("t1"), h).await;
            assert_eq!(turn.error_code(), Some("THREAD_ID_TAKEN"), "{who} at {url}");
            let cancel = json!({"threadId": "t1", "rosInvocationId": "inv-1"});
            let c = post(
                &format!("{url}extensions/iac-code/v1/executions/{exec}/cancel"),
                &cancel,
                h,
            )
            .await;
            assert_eq!(c.status, 404, "{who} at {url}");
        }
    }
    // With the user's credentials and no cluster secret, a forward would be refused for them:
    // a stranger is answered as for a missing thread before that (nothing tells it apart).
    let props = json!({"llmApiKey": "sk-bob"});
    let resume = resume_body("t1", "rc", &ws.cwd("t1"), "inv-1", allow("perm-1"));
    let mut resume = resume;
    resume["forwardedProps"]["iacCode"]["llmApiKey"] = json!("sk-bob");
    let r = post(&b.url(), &resume, &bo).await;
    assert_eq!(r.error_code(), Some("EXECUTION_LOST"), "{:?}", r.json);
    let turn = post(
        &b.url(),
        &body("t1", "rc2", "hi", &ws.cwd("t1"), props),
        &bo,
    )
    .await;
    assert_eq!(
        turn.error_code(),
        Some("THREAD_ID_TAKEN"),
        "{:?}",
        turn.json
    );
    assert_eq!(ka.calls("SendStreamingMessage").len(), sends);
    assert!(ka.calls("CancelTask").is_empty());
    assert!(kb.calls("SendStreamingMessage").is_empty());

    // Whoever reads the forward key from the database cannot claim a caller without a user
    // where authentication is configured: such a mark is no mark (401, no credentials).
    let key = pg.psql("identity", "SELECT forward_key FROM agui_cluster");
    let forged = [
        ("x-iac-code-agui-forwarded-by", "someone"),
        ("x-iac-code-agui-forward-key", key.trim()),
        ("x-iac-code-agui-caller", "open"),
    ];
    for inst in [&a, &b] {
        let (status, _) = get_as(&format!("{}threads/t1", inst.url()), &forged).await;
        assert_eq!(status, 401, "an open caller was taken from a keyed mark");
    }

    // Alice's list, at either instance, and the service's (acting for nobody: every thread).
    for (h, inst) in [
        (&al[..], &a),
        (&al[..], &b),
        (&[("authorization", "Bearer svc")][..], &b),
    ] {
        let (status, list) = get_as(&format!("{}threads", inst.url()), h).await;
        assert_eq!(status, 200, "{list}");
        let t = &list["threads"][0];
        assert_eq!(list["threads"].as_array().unwrap().len(), 1, "{list}");
        assert_eq!((&t["threadId"], &t["title"]), (&json!("t1"), &json!("hi")));
        assert_eq!(t["pendingInterrupts"], 1);
        assert!(list.get("nextCursor").is_none());
    }

    // Alice, asking B: her state, and her answer reaches the holder's kernel.
    let (status, state) = get_as(&format!("{}threads/t1", b.url()), &al).await;
    assert_eq!(status, 200);
    assert_eq!(state["pendingInterrupts"][0]["id"], "perm-1");
    accepting_resume(&ka, "t1", "task-1", "perm-1");
    let resume = resume_body("t1", "r2", &ws.cwd("t1"), "inv-1", allow("perm-1"));
    let r = post(&b.url(), &resume, &al).await;
    assert_valid_run(&r, "t1", "r2");
    assert_eq!(ka.calls("SendStreamingMessage").len(), sends + 1);
    assert!(kb.calls("SendStreamingMessage").is_empty());
    // Renamed and then deleted by Alice at B (the holder, A, does both): gone for every
    // instance, row and transcript.
    let client = reqwest::Client::new();
    let r = client
        .patch(format!("{}threads/t1", b.url()))
        .header("authorization", &alice)
        .header("content-type", "application/json")
        .body(r#"{"title":"Renamed"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, list) = get_as(&format!("{}threads", a.url()), &al).await;
    assert_eq!(list["threads"][0]["title"], "Renamed");
    let del = |h: &str| {
        client
            .delete(format!("{}threads/t1", b.url()))
            .header("authorization", h.to_owned())
            .send()
    };
    assert_eq!(del(&bob).await.unwrap().status(), 404);
    assert_eq!(del(&alice).await.unwrap().status(), 200);
    for inst in [&a, &b] {
        let (status, _) = get_as(&format!("{}threads/t1", inst.url()), &al).await;
        assert_eq!(status, 404);
        let (_, list) = get_as(&format!("{}threads", inst.url()), &al).await;
        assert_eq!(list["threads"], json!([]));
    }
    let left = pg.psql(
        "identity",
        "SELECT (SELECT count(*) FROM agui_threads WHERE thread_id = 't1')
              + (SELECT count(*) FROM agui_transcript WHERE thread_id = 't1')",
    );
    assert_eq!(left.trim(), "0");
    // Its tombstone: Bob's thread of the same id, made at B, is the id's second incarnation,
    // in a kernel context of its own (the deleted thread's conversation is not his).
    let deletions = pg.psql(
        "identity",
        "SELECT deletions FROM agui_deleted WHERE thread_id = 't1'",
    );
    assert_eq!(deletions.trim(), "1");
    let again = engine::run::incarnation_context_id("t1", 1);
    kb.stream(
        Stream::of("task-b", &again)
            .submitted(json!({"iacCodeSessionId": "sess-b"}))
            .completed(),
    );
    let r = post_turn_as(&b.url(), "t1", "r1", "mine", &ws.cwd("t1b"), &bo).await;
    assert_valid_run(&r, "t1", "r1");
    let sent = kb.calls("SendStreamingMessage");
    assert_eq!(sent[0].body["params"]["message"]["contextId"], json!(again));
    let (_, _, doc) = row(&pg, "identity", "t1");
    assert_eq!(
        (&doc["contextId"], &doc["owner"]),
        (&json!(again), &json!("bob"))
    );
}
