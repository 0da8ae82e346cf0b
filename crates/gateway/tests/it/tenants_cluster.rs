//! Two instances on one PostgreSQL, each with users' own kernels (`--kernel-isolation user`,
//! kernels as `nobody` when root), the users' session backups and iac-code directories on
//! storage both share (`--kernel-backup-dir`, `--kernel-persistence-dir`): a user's answer asked
//! at B while A holds the thread is carried out by A in the user's kernel there; A killed with
//! -9, B takes two users' threads over, starts a kernel of each user's and restores each session
//! from `<backup>/<key>`: every tool runs once and the conversations go on at B.

use std::path::Path;
use std::time::{Duration, Instant};

use testkit::postgres::Cluster;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::cluster::row;
use crate::support::{post_turn_as, resume_body};
use crate::tenants_chaos::{allow, ws_of};
use crate::tenants_real::{as_user, passable, refs, sessions, Isolated};

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Every file under `dir`, with its contents (binary ones lossily).
fn files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            let text = String::from_utf8_lossy(&std::fs::read(&p).unwrap_or_default()).into_owned();
            out.push((p.display().to_string(), text));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_threads_are_forwarded_and_taken_over_with_their_own_kernels() {
    let env = KernelEnv::new().await;
    let pg = Cluster::start();
    let db = pg.create_db("tenantscluster");
    let shared = env.dir.path().join("shared");
    passable(&shared);
    let (backup, tasks) = (shared.join("backup"), shared.join("tasks"));
    let args = [
        "--state-url".to_owned(),
        db.clone(),
        "--lease-ttl".into(),
        "3".into(),
        "--kernel-backup-dir".into(),
        backup.display().to_string(),
        "--kernel-persistence-dir".into(),
        tasks.display().to_string(),
    ];
    let state = |me: &str| env.dir.path().join(format!("state-{me}"));
    let mut a = Isolated::start(&env, &state("a"), 2, &args).await;
    let b = Isolated::start(&env, &state("b"), 2, &args).await;
    let cwd = |user: &str, t: &str| ws_of(&env, user, t).display().to_string();
    let out = |user: &str, t: &str| ws_of(&env, user, t).join("out.txt");
    let turn = |url: &str, user: &str, t: &str, run: &str, msg: &str| {
        let (url, cwd, h) = (url.to_owned(), cwd(user, t), as_user(user));
        let (t, run, msg) = (t.to_owned(), run.to_owned(), msg.to_owned());
        async move { post_turn_as(&url, &t, &run, &msg, &cwd, &refs(&h)).await }
    };
    let resume = |url: &str, user: &str, t: &str, run: &str, r: &RunResult| {
        let body = resume_body(t, run, &cwd(user, t), "inv-1", allow(r));
        let (url, h) = (url.to_owned(), as_user(user));
        async move { post(&url, &body, &refs(&h)).await }
    };

    // A alive: alice's answer asked at B is forwarded to A, whose kernel of hers runs the tool;
    // B starts no kernel.
    let r1 = turn(&a.url, "alice", "p1", "r1", "Run it. scenario:bash").await;
    assert_valid_run(&r1, "p1", "r1");
    assert_eq!(
        r1.last()["outcome"]["type"],
        "interrupt",
        "{}\nA: {}",
        r1.raw,
        a.log()
    );
    let r2 = resume(&b.url, "alice", "p1", "r2", &r1).await;
    assert_valid_run(&r2, "p1", "r2");
    assert_eq!(
        r2.last()["outcome"]["type"],
        "success",
        "{}\nB: {}",
        r2.raw,
        b.log()
    );
    assert_eq!(lines(&out("alice", "p1")), 1, "the tool ran once");
    let replay = resume(&b.url, "alice", "p1", "r3", &r1).await;
    assert_eq!(
        replay.last()["code"],
        "RESUME_ALREADY_APPLIED",
        "{}",
        replay.raw
    );
    assert_eq!(lines(&out("alice", "p1")), 1);
    assert_eq!(a.kernels().await.len(), 1);
    assert!(b.kernels().await.is_empty(), "{}", b.health().await);

    // Alice and bob interrupted at A, each in their own kernel there; each session backed up
    // under its user's key on the shared storage.
    let users = [("alice", "p2"), ("bob", "q2")];
    let mut asked = Vec::new();
    for (user, t) in users {
        let r1 = turn(&a.url, user, t, "r1", "Run it. scenario:bash").await;
        assert_valid_run(&r1, t, "r1");
        assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
        let session = sessions(&r1).pop().expect("a session");
        let mine = backup.join(kernel::tenant::user_key(Some(user)));
        let start = Instant::now();
        while !files(&mine)
            .iter()
            .any(|(p, t)| p.contains(&session) || t.contains(&session))
        {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{session} never backed up in {}: {:?}",
                mine.display(),
                files(&backup).iter().map(|(p, _)| p).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let kernel_at_a = row(&pg, &db, t).2["kernel"].clone();
        assert!(
            kernel_at_a
                .as_str()
                .is_some_and(|k| k.starts_with("tenant:")),
            "{kernel_at_a}"
        );
        asked.push((r1, session, kernel_at_a));
    }
    assert_eq!(a.kernels().await.len(), 2);
    assert_ne!(asked[0].2, asked[1].2, "one kernel each at A");

    // A killed: B takes both threads over; a kernel of each user's restores their session and
    // finds their task.
    a.kill9();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let mut at_b = Vec::new();
    for ((user, t), (r1, session, kernel_at_a)) in users.into_iter().zip(&asked) {
        let r2 = resume(&b.url, user, t, "r2", r1).await;
        assert_valid_run(&r2, t, "r2");
        assert_eq!(
            r2.last()["outcome"]["type"],
            "success",
            "{user}: {}\nB: {}",
            r2.raw,
            b.log()
        );
        assert_eq!(lines(&out(user, t)), 1, "{user}'s tool ran once");
        let replay = resume(&b.url, user, t, "r3", r1).await;
        assert_eq!(
            replay.last()["code"],
            "RESUME_ALREADY_APPLIED",
            "{}",
            replay.raw
        );
        let (_, _, doc) = row(&pg, &db, t);
        assert_ne!(doc["kernel"], *kernel_at_a, "{doc}");
        at_b.push(doc["kernel"].clone());
        // The conversation goes on at B, in the same session.
        let r4 = turn(&b.url, user, t, "r4", "Hi. scenario:text").await;
        assert_valid_run(&r4, t, "r4");
        assert_eq!(r4.last()["outcome"]["type"], "success", "{}", r4.raw);
        let later = sessions(&r4);
        assert!(
            !later.is_empty() && later.iter().all(|s| s == session),
            "{user}: {session} then {later:?}"
        );
        assert_eq!(lines(&out(user, t)), 1);
    }
    assert_ne!(at_b[0], at_b[1], "one kernel each at B");
    assert_eq!(b.kernels().await.len(), 2);
}
