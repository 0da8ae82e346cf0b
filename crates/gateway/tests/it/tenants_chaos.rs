//! `--kernel-isolation user` through the binary and the real kernel (as `nobody` when root),
//! under what the shared mode's identity and chaos tests put a gateway through: a JWT user's
//! permission interrupt is answered by its owner only, and a user's kernel killed with -9 is
//! restarted by its supervisor without touching another user's kernel or running turn.
//!
//! The gateway's log goes to a file each failure prints (`tenants_real::Isolated`).

use std::path::{Path, PathBuf};

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::fake_llm::Plan;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::pool_real::signal;
use crate::support::{bearer_for, get_as, jwks_file, post_turn_as, resume_body};
use crate::tenants_real::{as_user, is_root, refs, sessions, tool_result, Isolated};

/// `user`'s workspace `name` under the environment's root.
pub(crate) fn ws_of(env: &KernelEnv, user: &str, name: &str) -> PathBuf {
    env.ws()
        .join(kernel::tenant::user_key(Some(user)))
        .join(name)
}

/// The answer allowing a run's first interrupt once.
pub(crate) fn allow(r: &RunResult) -> Value {
    let id = r.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no interrupt: {}", r.raw))
        .to_owned();
    json!([{"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}])
}

/// The identity_real scenario with isolation on: alice's (JWT) interrupt is not bob's to see or
/// answer — his answer is refused before any kernel, his own kernel never started — and alice's
/// answer runs the tool once, in her kernel, in her workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_users_interrupt_is_answered_by_its_owner_only_in_their_own_kernel() {
    let env = KernelEnv::new().await;
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    let extra = [
        "--auth-jwks".to_owned(),
        jwks.display().to_string(),
        "--auth-issuer".into(),
        testkit::jwt::ISSUER.into(),
        "--auth-audience".into(),
        testkit::jwt::AUDIENCE.into(),
    ];
    let g = Isolated::start(&env, &env.state_dir(), 2, &extra).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    let b = [("authorization", bob.as_str())];
    let w = ws_of(&env, "alice", "owned").display().to_string();
    let r1 = post_turn_as(&g.url, "owned", "r1", "Run it. scenario:bash", &w, &a).await;
    assert_valid_run(&r1, "owned", "r1");
    assert_eq!(
        r1.last()["outcome"]["type"],
        "interrupt",
        "{}\n{}",
        r1.raw,
        g.log()
    );
    let out = Path::new(&w).join("out.txt");

    // Bob: no such thread; his answer, with her cwd or one of his own, is refused and the tool
    // does not run; no kernel is started for him.
    let (status, _) = get_as(&format!("{}threads/owned", g.url), &b).await;
    assert_eq!(status, 404);
    let own = ws_of(&env, "bob", "owned").display().to_string();
    for (cwd, status, code) in [(&w, 400, "INVALID_INPUT"), (&own, 409, "EXECUTION_LOST")] {
        let stolen = post(
            &g.url,
            &resume_body("owned", "rb", cwd, "inv-1", allow(&r1)),
            &b,
        )
        .await;
        assert_eq!(
            (stolen.status, stolen.error_code()),
            (status, Some(code)),
            "{cwd}: {}",
            stolen.raw
        );
    }
    assert!(!out.exists(), "another user's answer ran the tool");
    assert_eq!(g.kernels().await.len(), 1, "{}", g.health().await);

    // Alice answers: the tool runs, once, where her kernel's uid wrote it.
    let r2 = post(
        &g.url,
        &resume_body("owned", "r2", &w, "inv-1", allow(&r1)),
        &a,
    )
    .await;
    assert_valid_run(&r2, "owned", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "agui-test\n");
    if is_root() {
        use std::os::unix::fs::MetadataExt as _;
        assert_eq!(std::fs::metadata(&out).unwrap().uid(), 65534);
    }
    let (_, state) = get_as(&format!("{}threads/owned", g.url), &a).await;
    assert_eq!(state["binding"]["userId"], "alice");
    assert_eq!(g.kernels().await.len(), 1);
}

/// A turn of `user` on `thread` in their workspace `cwd`.
async fn turn(
    g: &Isolated,
    user: &str,
    thread: &str,
    run: &str,
    msg: &str,
    cwd: &Path,
) -> RunResult {
    let h = as_user(user);
    post_turn_as(
        &g.url,
        thread,
        run,
        msg,
        &cwd.display().to_string(),
        &refs(&h),
    )
    .await
}

/// Two users' kernels, each with a turn running; alice's kernel killed with -9: her turn ends
/// with `A2A_UNAVAILABLE`, bob's runs to its end on his kernel (neither restarted nor replaced);
/// her kernel's supervisor starts it again (same seat, another pid, the same directories, so
/// no restore is needed) and her next turn on the thread goes on in the same session, reading
/// what her first turn wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_kernel_killed_mid_turn_comes_back_and_leaves_anothers_turn_alone() {
    let env = KernelEnv::new().await;
    let g = Isolated::start(&env, &env.state_dir(), 2, &[]).await;
    let (aw, bw) = (ws_of(&env, "alice", "p"), ws_of(&env, "bob", "p"));

    // Alice's first turn writes a note (her permission given); bob's kernel starts too.
    env.llm.script(
        "note",
        Plan::tool(
            "Noting.",
            "bash",
            json!({"command": "echo first-turn > note.txt && cat note.txt"}),
        ),
    );
    let r1 = turn(&g, "alice", "a-1", "r1", "Go. scenario:note", &aw).await;
    assert_eq!(
        r1.last()["outcome"]["type"],
        "interrupt",
        "{}\n{}",
        r1.raw,
        g.log()
    );
    let h = as_user("alice");
    let body = resume_body("a-1", "r2", &aw.display().to_string(), "inv-1", allow(&r1));
    let r2 = post(&g.url, &body, &refs(&h)).await;
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    assert!(tool_result(&r2).contains("first-turn"), "{}", r2.raw);
    let session = sessions(&r2).pop().expect("a session");
    let alice_pid = g.kernels().await[0]["pid"].as_u64().expect("alice's pid");
    let b1 = turn(&g, "bob", "b-1", "r1", "Hi. scenario:text", &bw).await;
    assert_eq!(b1.last()["outcome"]["type"], "success", "{}", b1.raw);
    let before = g.kernels().await;
    assert_eq!(before.len(), 2, "{before:?}");
    let bob_pid = before
        .iter()
        .filter_map(|s| s["pid"].as_u64())
        .find(|p| *p != alice_pid)
        .expect("bob's pid");

    // Both turns stream for ~5 s; alice's kernel is killed in the middle of hers.
    env.llm.script(
        "long",
        Plan {
            text: (0..50).map(|i| format!("tick{i} ")).collect(),
            delay: Duration::from_millis(100),
            ..Plan::default()
        },
    );
    let spawn = |user: &'static str, thread: &'static str, cwd: PathBuf| {
        let url = g.url.clone();
        tokio::spawn(async move {
            let h = as_user(user);
            let cwd = cwd.display().to_string();
            post_turn_as(&url, thread, "r3", "Long. scenario:long", &cwd, &refs(&h)).await
        })
    };
    let (ra, rb) = (
        spawn("alice", "a-1", aw.clone()),
        spawn("bob", "b-1", bw.clone()),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(alice_pid as i32, libc::SIGKILL);
    let (ra, rb) = (ra.await.unwrap(), rb.await.unwrap());
    assert_valid_run(&ra, "a-1", "r3");
    assert_eq!(ra.last()["code"], "A2A_UNAVAILABLE", "{}", ra.raw);
    assert_valid_run(&rb, "b-1", "r3");
    assert_eq!(rb.last()["outcome"]["type"], "success", "{}", rb.raw);
    assert!(rb.text().contains("tick49"), "{}", rb.raw);

    // Alice's seat: restarted in place, once; bob's untouched.
    let start = Instant::now();
    let after = loop {
        let k = g.kernels().await;
        let alices = k.iter().find(|s| s["pid"].as_u64() != Some(bob_pid));
        if k.len() == 2 && alices.is_some_and(|s| s["state"] == "ready" && s["restarts"] == 1) {
            break k;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{k:?}\n{}",
            g.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let bobs = after.iter().find(|s| s["pid"].as_u64() == Some(bob_pid));
    assert_eq!(bobs.expect("bob's kernel")["restarts"], 0, "{after:?}");
    assert!(
        after.iter().all(|s| s["pid"].as_u64() != Some(alice_pid)),
        "{after:?}"
    );

    // Her next turn: the same session, her note still there.
    env.llm.script(
        "reread",
        Plan::tool("Reading.", "bash", json!({"command": "cat note.txt"})),
    );
    let r4 = turn(&g, "alice", "a-1", "r4", "Again. scenario:reread", &aw).await;
    assert_valid_run(&r4, "a-1", "r4");
    assert_eq!(
        r4.last()["outcome"]["type"],
        "success",
        "{}\n{}",
        r4.raw,
        g.log()
    );
    assert!(tool_result(&r4).contains("first-turn"), "{}", r4.raw);
    let again = sessions(&r4);
    assert!(
        !again.is_empty() && again.iter().all(|s| *s == session),
        "{session} then {again:?}"
    );
    // Bob's thread goes on too.
    let b2 = turn(&g, "bob", "b-1", "r4", "Hi. scenario:text", &bw).await;
    assert_eq!(b2.last()["outcome"]["type"], "success", "{}", b2.raw);
}
