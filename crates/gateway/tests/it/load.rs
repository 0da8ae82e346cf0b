//! Load: 1,000 concurrent runs through a kernel of our own and 50 through the real kernel, zero
//! errors, then no leaked tokio task or file descriptor.
//!
//! Leaks are counted in steady state: after a first burst the process holds its warm pools (at
//! most `a2a::POOL_IDLE_PER_KERNEL` kernel connections, two descriptors and two tasks each when the
//! kernel runs in this process); a second identical burst must end with exactly as many tasks and
//! descriptors as the first, and both within the pool bound of the count before any load.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post, RunResult};
use testkit::synthetic_kernel::SyntheticKernel;

use crate::support::{body, managed, server, Builder, TestServer};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Waits until the task and descriptor counts stop changing (closing connections settle), and
/// returns them.
async fn settled() -> (usize, usize) {
    let mut last = (usize::MAX, usize::MAX);
    let mut stable = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = (alive_tasks(), testkit::open_fds());
        if now == last {
            stable += 1;
            if stable >= 5 {
                return now;
            }
        } else {
            stable = 0;
            last = now;
        }
        if Instant::now() > deadline {
            return now;
        }
    }
}

/// The kernel (uvicorn) closes idle keep-alive connections after 5 s: wait that out, so the
/// counts do not depend on which pooled connections happen to be alive.
async fn settled_after_keep_alive() -> (usize, usize) {
    tokio::time::sleep(Duration::from_secs(6)).await;
    settled().await
}

async fn burst(s: &TestServer, n: usize, text: &str, tag: &str) -> Vec<RunResult> {
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let url = s.url.clone();
        let b = body(
            &format!("{tag}-{i}"),
            &format!("run-{tag}-{i}"),
            text,
            &s.ws("w"),
            json!({}),
        );
        handles.push(tokio::spawn(async move { post(&url, &b, &[]).await }));
    }
    let mut out = Vec::with_capacity(n);
    for h in handles {
        out.push(h.await.expect("client task"));
    }
    out
}

fn assert_all_succeeded(runs: &[RunResult], tag: &str, deltas: usize) {
    for (i, r) in runs.iter().enumerate() {
        assert_valid_run(r, &format!("{tag}-{i}"), &format!("run-{tag}-{i}"));
        assert_eq!(
            r.last()["outcome"]["type"],
            "success",
            "{tag}-{i}: {}",
            r.raw
        );
        assert_eq!(r.of("TEXT_MESSAGE_CONTENT").len(), deltas, "{tag}-{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_runs_no_errors_no_leaks() {
    let limit = testkit::raise_fd_limit();
    assert!(
        limit >= 5_000,
        "the open-file limit {limit} is too low for this test"
    );
    let kernel = SyntheticKernel::start().await;
    let s = Builder::new().a2a(&kernel.url(), None).start().await;
    // Warm-up (lazy statics, the first pooled connection), then the baseline.
    assert_all_succeeded(&burst(&s, 1, "deltas:5", "warm").await, "warm", 5);
    let (tasks0, fds0) = settled().await;

    let t = Instant::now();
    let runs = burst(&s, 1000, "deltas:20", "a").await;
    let took = t.elapsed();
    assert_all_succeeded(&runs, "a", 20);
    drop(runs);
    let (tasks1, fds1) = settled().await;

    let runs = burst(&s, 1000, "deltas:20", "b").await;
    assert_all_succeeded(&runs, "b", 20);
    drop(runs);
    let (tasks2, fds2) = settled().await;
    eprintln!(
        "1,000 concurrent runs in {took:?}; tasks {tasks0} → {tasks1} → {tasks2}, fds {fds0} → {fds1} → {fds2}"
    );
    let pool = 2 * a2a::POOL_IDLE_PER_KERNEL;
    assert!(
        tasks1 <= tasks0 + pool && fds1 <= fds0 + pool,
        "more than the warm pools are held"
    );
    assert_eq!(tasks2, tasks1, "a burst leaked tokio tasks");
    assert_eq!(fds2, fds1, "a burst leaked file descriptors");
    // Every thread is released.
    assert!(!s.state.rt.threads().busy(), "a thread is still held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_runs_through_the_real_kernel() {
    testkit::raise_fd_limit();
    let env = KernelEnv::new().await;
    let kernel = managed(&env).await;
    let s = server(&env, kernel).await;
    std::fs::create_dir_all(env.ws().join("w")).unwrap();
    assert_all_succeeded(&burst(&s, 1, "Hi. scenario:text", "warm").await, "warm", 3);
    let (tasks0, fds0) = settled_after_keep_alive().await;

    let t = Instant::now();
    let runs = burst(&s, 50, "Hello. scenario:text", "r").await;
    let took = t.elapsed();
    assert_all_succeeded(&runs, "r", 3);
    drop(runs);
    let (tasks1, fds1) = settled_after_keep_alive().await;
    let runs = burst(&s, 50, "Hello. scenario:text", "s").await;
    assert_all_succeeded(&runs, "s", 3);
    drop(runs);
    let (tasks2, fds2) = settled_after_keep_alive().await;
    eprintln!(
        "50 concurrent real-kernel runs in {took:?}; tasks {tasks0} → {tasks1} → {tasks2}, fds {fds0} → {fds1} → {fds2}"
    );
    let pool = a2a::POOL_IDLE_PER_KERNEL;
    assert!(
        tasks1 <= tasks0 + pool && fds1 <= fds0 + pool,
        "more than the warm pool is held"
    );
    assert_eq!(tasks2, tasks1, "a burst leaked tokio tasks");
    assert_eq!(fds2, fds1, "a burst leaked file descriptors");
    assert!(!s.state.rt.threads().busy(), "a thread is still held");
}
