//! A pool of kernels against the real kernel (`iac-code a2a` 0.16.0, pinned venv) driven by the
//! scripted fake LLM: managed kernels (`--kernels N`) and external ones (`--a2a-url` repeated).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::real_kernel::{KernelEnv, KernelProcess};
use testkit::sse::{assert_valid_run, post};

use crate::real_kernel::{alive, answer, descendants, gateway_process, ws};
use crate::support::{body, client, post_resume, post_turn, Builder};

/// Every `.json` thread document under `dir`, as JSON.
pub(crate) fn thread_docs(dir: &std::path::Path) -> Vec<Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(thread_docs(&p));
        } else if p.extension().is_some_and(|x| x == "json") {
            if let Ok(v) = serde_json::from_slice::<Value>(&std::fs::read(&p).unwrap()) {
                if v.get("threadId").is_some() {
                    out.push(v);
                }
            }
        }
    }
    out
}

/// Sends `sig` to process `pid`.
pub(crate) fn signal(pid: i32, sig: i32) {
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// A gateway process with a pool of `n` kernels, all ready: the process, its port and its
/// `/health`.
async fn pool_process(env: &KernelEnv, n: usize) -> (std::process::Child, u16, Value) {
    let (gw, port) = gateway_process(env, &["--kernels", &n.to_string()]).await;
    (gw, port, pool_ready(port, n).await)
}

/// `/health` once all `n` kernels of the gateway on `port` are ready (90 s for one, 30 s more
/// a kernel).
pub(crate) async fn pool_ready(port: u16, n: usize) -> Value {
    let c = client();
    let start = Instant::now();
    loop {
        if let Ok(r) = c
            .get(format!("http://127.0.0.1:{port}/health"))
            .send()
            .await
        {
            let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
            // One kernel is `kernel` itself; several are its `slots`.
            let slots = match v["kernel"]["slots"].as_array() {
                Some(s) => s.clone(),
                None => vec![v["kernel"].clone()],
            };
            if slots.len() == n && slots.iter().all(|s| s["state"] == "ready") {
                return v;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60 + 30 * n as u64),
            "kernels never ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `--kernels 2` and `--kernels 3`: the kernel processes, all in `/health`; new threads spread
/// over them (each records its kernel), each thread's later turns stay in its session on its
/// kernel, and a stop takes them all down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_kernels_share_the_threads_and_each_thread_stays_on_its_own() {
    kernels_share_the_threads_and_each_thread_stays_on_its_own(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_kernels_share_the_threads_and_each_thread_stays_on_its_own() {
    kernels_share_the_threads_and_each_thread_stays_on_its_own(3).await;
}

async fn kernels_share_the_threads_and_each_thread_stays_on_its_own(n: usize) {
    let env = KernelEnv::new().await;
    let (mut gw, port, health) = pool_process(&env, n).await;
    assert_eq!(health["kernel"]["size"], n);
    let mut pids: Vec<u64> = health["kernel"]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pid"].as_u64().unwrap())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), n, "one process a kernel");
    let url = format!("http://127.0.0.1:{port}/");
    let threads: Vec<String> = (0..2 * n).map(|i| format!("k{i}")).collect();
    let mut sessions = vec![Vec::new(); threads.len()];
    // Turn by turn over all the threads: the second turns come after every thread was placed.
    for turn in 0..2 {
        for (i, t) in threads.iter().enumerate() {
            let run = format!("r{i}-{turn}");
            let b = body(t, &run, "Hi. scenario:text", &ws(&env, t), json!({}));
            let r = post(&url, &b, &[]).await;
            assert_valid_run(&r, t, &run);
            assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
            sessions[i].push(r.sessions().last().unwrap()["sessionId"].clone());
        }
    }
    for (t, s) in threads.iter().zip(&sessions) {
        assert!(s[0].is_string(), "{s:?}");
        assert_eq!(s[0], s[1], "{t} kept its session");
    }
    let kids = descendants(gw.id());
    signal(gw.id() as i32, libc::SIGTERM);
    assert_eq!(gw.wait().unwrap().code(), Some(0));
    for k in &kids {
        assert!(!alive(*k), "kernel process {k} survived the stop");
    }
    let docs = thread_docs(&env.state_dir());
    assert_eq!(docs.len(), threads.len());
    let mut keys: Vec<String> = docs
        .iter()
        .map(|d| d["kernel"].as_str().expect("a recorded kernel").to_owned())
        .collect();
    keys.sort();
    // Placed in turn: two threads on each kernel.
    let expected: Vec<String> = (0..n)
        .flat_map(|i| [format!("managed:{i}"), format!("managed:{i}")])
        .collect();
    assert_eq!(keys, expected);
}

/// `--kernels 2`, kill -9 of the kernel holding a thread's pending permission: the answer goes
/// through the other kernel (the thread moves there, its session restored first) and the tool
/// runs once; the killed kernel is restarted, the pool is whole again, and the thread's next
/// turn stays where it moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_kernels_pending_interrupt_is_answered_through_another() {
    let env = KernelEnv::new().await;
    let (mut gw, port, health) = pool_process(&env, 2).await;
    let url = format!("http://127.0.0.1:{port}/");
    let w = ws(&env, "d1");
    let r1 = post_turn(&url, "d1", "r1", "Run it. scenario:bash", &w).await;
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    // The first thread of an idle pool is on the first kernel.
    let pid = health["kernel"]["slots"][0]["pid"].as_u64().unwrap() as i32;
    signal(pid, libc::SIGKILL);
    let c = client();
    let start = Instant::now();
    loop {
        let r = c.get(format!("{url}health")).send().await.unwrap();
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        if v["kernel"]["slots"][0]["restarts"].as_u64() >= Some(1) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r2 = post_resume(&url, "d1", "r2", &w, "inv-1", answer(&r1, "allow_once")).await;
    assert_valid_run(&r2, "d1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    let out = std::path::Path::new(&w).join("out.txt");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "agui-test\n");
    let health = pool_ready(port, 2).await;
    assert_eq!(health["kernel"]["slots"][0]["restarts"], 1);
    let r3 = post_turn(&url, "d1", "r3", "Hi. scenario:text", &w).await;
    assert_eq!(r3.last()["outcome"]["type"], "success", "{}", r3.raw);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "agui-test\n");
    signal(gw.id() as i32, libc::SIGTERM);
    assert_eq!(gw.wait().unwrap().code(), Some(0));
    let docs = thread_docs(&env.state_dir());
    let d1 = docs.iter().find(|d| d["threadId"] == "d1").unwrap();
    assert_eq!(d1["kernel"], "managed:1");
}

/// `--kernels 2`, kill -9 of one kernel under 20 concurrent turns: every stream ends with exactly
/// one terminal event (those on the killed kernel with an error), every thread takes a new turn
/// afterwards, and the pool is whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_killed_under_load_loses_no_stream_and_no_thread() {
    let env = KernelEnv::new().await;
    let (mut gw, port, health) = pool_process(&env, 2).await;
    let url = format!("http://127.0.0.1:{port}/");
    let threads: Vec<String> = (0..20).map(|i| format!("l{i}")).collect();
    let runs: Vec<_> = threads
        .iter()
        .map(|t| {
            let (url, b) = (
                url.clone(),
                body(t, "r1", "Go. scenario:steady", &ws(&env, t), json!({})),
            );
            tokio::spawn(async move { post(&url, &b, &[]).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pid = health["kernel"]["slots"][0]["pid"].as_u64().unwrap() as i32;
    signal(pid, libc::SIGKILL);
    let mut failed = 0;
    for (t, run) in threads.iter().zip(runs) {
        let r = run.await.unwrap();
        assert_valid_run(&r, t, "r1");
        if r.last()["type"] == "RUN_ERROR" {
            failed += 1;
        }
    }
    assert!(failed > 0, "the killed kernel's turns end in an error");
    assert!(failed < threads.len(), "the other kernel's turns finish");
    for t in &threads {
        let b = body(t, "r2", "Hi. scenario:text", &ws(&env, t), json!({}));
        let r = post(&url, &b, &[]).await;
        assert_valid_run(&r, t, "r2");
        assert_eq!(r.last()["outcome"]["type"], "success", "{t}: {}", r.raw);
    }
    let health = pool_ready(port, 2).await;
    assert_eq!(health["kernel"]["slots"][0]["restarts"], 1);
    signal(gw.id() as i32, libc::SIGTERM);
    assert_eq!(gw.wait().unwrap().code(), Some(0));
}

/// Two kernels the operator runs (`--a2a-url` twice; one token; one task and session store):
/// new threads spread over them and stay; one is killed: once its probes have failed, `/health`
/// shows it dead and its threads go on in the other, their sessions restored there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_kernels_share_the_threads_and_a_dead_ones_go_on_in_another() {
    let env = KernelEnv::new().await;
    let token = "test-pool-token";
    let mut k0 = KernelProcess::start_with_token(&env, token).await;
    let k1 = KernelProcess::start_with_token(&env, token).await;
    let s = Builder::in_env(&env)
        .a2a(&format!("{},{}", k0.url(), k1.url()), Some(token))
        .start()
        .await;
    let health = |s: &crate::support::TestServer| {
        let url = format!("{}health", s.url);
        async move {
            let c = client();
            let r = c.get(url).send().await.unwrap();
            serde_json::from_slice::<Value>(&r.bytes().await.unwrap()).unwrap()
        }
    };
    let h = health(&s).await;
    assert_eq!(
        (&h["kernel"]["mode"], &h["kernel"]["size"]),
        (&json!("external"), &json!(2)),
        "{h}"
    );
    let threads = ["e0", "e1", "e2", "e3"];
    let mut sessions = Vec::new();
    let turn = |t: &'static str, run: String| {
        let (url, b) = (
            s.url.clone(),
            body(t, &run, "Hi. scenario:text", &ws(&env, t), json!({})),
        );
        async move {
            let r = post(&url, &b, &[]).await;
            assert_valid_run(&r, t, &run);
            assert_eq!(r.last()["outcome"]["type"], "success", "{t}: {}", r.raw);
            r.sessions().last().unwrap()["sessionId"].clone()
        }
    };
    for t in threads {
        sessions.push(turn(t, format!("{t}-1")).await);
    }
    let key = |t: &str| s.thread_doc(t)["kernel"].as_str().unwrap().to_owned();
    let keys: Vec<String> = threads.iter().map(|t| key(t)).collect();
    assert!(keys.iter().all(|k| k.starts_with("url:")), "{keys:?}");
    assert_eq!(
        (keys[0].clone(), keys[1].clone()),
        (keys[2].clone(), keys[3].clone())
    );
    assert_ne!(keys[0], keys[1], "new threads spread");
    // A second turn stays in its session on its kernel.
    for (i, t) in threads.iter().enumerate() {
        assert_eq!(turn(t, format!("{t}-2")).await, sessions[i], "{t}");
        assert_eq!(key(t), keys[i]);
    }
    k0.kill();
    let start = Instant::now();
    loop {
        let h = health(&s).await;
        let slot = &h["kernel"]["slots"][0];
        if slot["dead"] == true {
            assert_eq!(slot["up"], false, "{h}");
            assert_eq!(h["kernel"]["slots"][1]["up"], true, "{h}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never dead: {h}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every thread goes on, in its session, on the kernel that is left.
    for (i, t) in threads.iter().enumerate() {
        assert_eq!(turn(t, format!("{t}-3")).await, sessions[i], "{t}");
        assert_eq!(key(t), keys[1], "{t}");
    }
    drop(k1);
}
