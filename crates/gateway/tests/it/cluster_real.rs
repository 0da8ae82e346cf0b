//! Two instances on one PostgreSQL, each with its own managed real kernel (its own config dir),
//! the kernels' session backup and task directories shared (`--kernel-backup-dir`,
//! `--kernel-persistence-dir`): a permission interrupt made at A is resumed at B while A lives
//! (forwarded to A), and after A is killed with -9 (B takes the thread over and its kernel
//! restores the session and finds the task). The tool runs exactly once each time, and a replay
//! of the answer is refused. The same with a pool of two kernels at each instance.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::postgres::Cluster;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, RunResult};

use crate::cluster::Instance;
use crate::support::{client, post_resume, post_turn};

fn answer(r: &RunResult) -> Value {
    let id = r.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no interrupt: {}", r.raw))
        .to_owned();
    json!([{"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}])
}

/// The environment of one instance: the test's kernel environment, with a home (config dir)
/// of its own.
fn instance_env(env: &KernelEnv, home: &Path) -> Vec<(String, String)> {
    std::fs::create_dir_all(home.join(".iac-code")).unwrap();
    env.vars()
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "HOME" => (k, home.display().to_string()),
            "IAC_CODE_CONFIG_DIR" => (k, home.join(".iac-code").display().to_string()),
            _ => (k, v),
        })
        .collect()
}

/// Instance `me` on the database `db` with `kernels` managed kernels of its own (its own config
/// dir), their session backups and tasks in directories every instance shares, a 3 s lease.
fn start_instance(env: &KernelEnv, db: &str, me: &str, kernels: usize) -> Instance {
    let shared = env.dir.path().join("shared");
    let args = [
        "--a2a-command".to_owned(),
        env.command(),
        "--kernels".to_owned(),
        kernels.to_string(),
        "--lease-ttl".to_owned(),
        "3".to_owned(),
        "--kernel-backup-dir".to_owned(),
        shared.join("backup").display().to_string(),
        "--kernel-persistence-dir".to_owned(),
        shared.join("tasks").display().to_string(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let home = env.dir.path().join(format!("home-{me}"));
    Instance::start(db, &args, &instance_env(env, &home))
}

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_made_at_one_instance_is_resumed_at_another_once() {
    let env = KernelEnv::new().await;
    let pg = Cluster::start();
    let db = pg.create_db("realcluster");
    let start = |me: &str| start_instance(&env, &db, me, 1);
    let mut a = start("a");
    let b = start("b");
    pool_ready(&a, 1).await;
    pool_ready(&b, 1).await;
    let ws = |name: &str| env.ws().join(name).display().to_string();

    // A alive: the resume asked at B is forwarded to A, whose kernel has the task.
    let r1 = post_turn(&a.url(), "p1", "r1", "Run it. scenario:bash", &ws("p1")).await;
    assert_valid_run(&r1, "p1", "r1");
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    let r2 = post_resume(&b.url(), "p1", "r2", &ws("p1"), "inv-1", answer(&r1)).await;
    assert_valid_run(&r2, "p1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    let out = env.ws().join("p1").join("out.txt");
    assert_eq!(lines(&out), 1, "the tool ran once");
    let replay = post_resume(&b.url(), "p1", "r3", &ws("p1"), "inv-1", answer(&r1)).await;
    assert_eq!(
        replay.last()["code"],
        "RESUME_ALREADY_APPLIED",
        "{}",
        replay.raw
    );
    assert_eq!(lines(&out), 1);

    // A killed: B takes the thread over, its kernel restores the session from the shared
    // backup and finds the task in the shared directory.
    let r1 = post_turn(&a.url(), "p2", "r1", "Run it. scenario:bash", &ws("p2")).await;
    assert_valid_run(&r1, "p2", "r1");
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    // The kernel backs the session up in the background: give it the moment it takes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.kill9();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let r2 = post_resume(&b.url(), "p2", "r2", &ws("p2"), "inv-1", answer(&r1)).await;
    assert_valid_run(&r2, "p2", "r2");
    assert_eq!(
        r2.last()["outcome"]["type"],
        "success",
        "{}\nB: {}",
        r2.raw,
        b.log()
    );
    let out = env.ws().join("p2").join("out.txt");
    assert_eq!(lines(&out), 1, "the tool ran once");
    let replay = post_resume(&b.url(), "p2", "r3", &ws("p2"), "inv-1", answer(&r1)).await;
    assert_eq!(
        replay.last()["code"],
        "RESUME_ALREADY_APPLIED",
        "{}",
        replay.raw
    );
    assert_eq!(lines(&out), 1);
    // And the thread goes on at B.
    let r4 = post_turn(&b.url(), "p2", "r4", "Hi. scenario:text", &ws("p2")).await;
    assert_valid_run(&r4, "p2", "r4");
    assert_eq!(r4.last()["outcome"]["type"], "success", "{}", r4.raw);
}

/// Once the `n` kernels of `i` are all ready (one kernel is `/health`'s `kernel` itself; several
/// are its `slots`).
async fn pool_ready(i: &Instance, n: usize) {
    let c = client();
    let start = Instant::now();
    loop {
        if let Ok(r) = c.get(format!("{}health", i.url())).send().await {
            let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or_default();
            let slots = match v["kernel"]["slots"].as_array() {
                Some(s) => s.clone(),
                None => vec![v["kernel"].clone()],
            };
            if slots.len() == n && slots.iter().all(|s| s["state"] == "ready") {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "kernels never ready: {}",
            i.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Two instances, each with a pool of two kernels (`--kernels 2`), on one PostgreSQL: threads
/// made at A spread over A's kernels; an answer asked at B while A lives is carried out by A, on
/// the thread's kernel there; A killed with -9: B takes each of its other threads over, whichever
/// of A's kernels it was on, places it on one of its own (recording it) and restores its session
/// there. Every tool runs once, a replayed answer is refused, and each thread goes on at B on
/// the kernel it was given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_with_pools_of_kernels_take_threads_over() {
    let env = KernelEnv::new().await;
    let pg = Cluster::start();
    let db = pg.create_db("realpools");
    let start = |me: &str| start_instance(&env, &db, me, 2);
    let mut a = start("a");
    let b = start("b");
    pool_ready(&a, 2).await;
    pool_ready(&b, 2).await;
    let ws = |name: &str| env.ws().join(name).display().to_string();
    let kernel_of = |t: &str| crate::cluster::row(&pg, &db, t).2["kernel"].clone();

    // Three threads interrupted at A, over both of its kernels.
    let threads = ["q0", "q1", "q2"];
    let mut asked = Vec::new();
    for t in threads {
        let r = post_turn(&a.url(), t, "r1", "Run it. scenario:bash", &ws(t)).await;
        assert_valid_run(&r, t, "r1");
        assert_eq!(r.last()["outcome"]["type"], "interrupt", "{}", r.raw);
        asked.push(r);
    }
    let at_a: Vec<Value> = threads.iter().map(|t| kernel_of(t)).collect();
    assert_eq!(
        at_a,
        [json!("managed:0"), json!("managed:1"), json!("managed:0")]
    );

    // A alive: q1's answer, asked at B, is carried out by A on q1's kernel there.
    let r = post_resume(&b.url(), "q1", "r2", &ws("q1"), "inv-1", answer(&asked[1])).await;
    assert_valid_run(&r, "q1", "r2");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    assert_eq!(lines(&env.ws().join("q1").join("out.txt")), 1);
    assert_eq!(kernel_of("q1"), "managed:1");

    // A killed: B takes q0 and q2 over (both on A's first kernel) and spreads them over its own.
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.kill9();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let mut at_b = Vec::new();
    for (i, t) in [(0, "q0"), (2, "q2")] {
        let r = post_resume(&b.url(), t, "r2", &ws(t), "inv-1", answer(&asked[i])).await;
        assert_valid_run(&r, t, "r2");
        assert_eq!(
            r.last()["outcome"]["type"],
            "success",
            "{}\nB: {}",
            r.raw,
            b.log()
        );
        assert_eq!(
            lines(&env.ws().join(t).join("out.txt")),
            1,
            "{t}'s tool ran once"
        );
        let replay = post_resume(&b.url(), t, "r3", &ws(t), "inv-1", answer(&asked[i])).await;
        assert_eq!(
            replay.last()["code"],
            "RESUME_ALREADY_APPLIED",
            "{}",
            replay.raw
        );
        at_b.push(kernel_of(t));
    }
    at_b.sort_by_key(|k| k.to_string());
    assert_eq!(
        at_b,
        [json!("managed:0"), json!("managed:1")],
        "spread at B"
    );

    // Every thread goes on at B, on the kernel it was given there, the tools not run again.
    for t in threads {
        let before = kernel_of(t);
        let r = post_turn(&b.url(), t, "r4", "Hi. scenario:text", &ws(t)).await;
        assert_valid_run(&r, t, "r4");
        assert_eq!(r.last()["outcome"]["type"], "success", "{t}: {}", r.raw);
        assert_eq!(lines(&env.ws().join(t).join("out.txt")), 1);
        if t != "q1" {
            assert_eq!(kernel_of(t), before, "{t} stays on its kernel at B");
        }
    }
}
