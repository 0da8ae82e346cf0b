//! Test kit: a scriptable fake A2A kernel, a scripted fake LLM for the real kernel, an SSE client
//! with stream invariants, helpers to locate and configure the pinned real kernel, an OTLP trace
//! receiver, a real Prometheus and a private PostgreSQL cluster.

pub mod chaos;
pub mod fake_kernel;
pub mod fake_llm;
pub mod jwt;
pub mod otlp;
pub mod postgres;
pub mod prometheus;
pub mod real_kernel;
pub mod sse;
pub mod synthetic_kernel;
pub mod tls;

/// A free loopback port (free when asked: bind it soon).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Serves `app` on a fresh loopback port in the background (the fake services' listener); its
/// address.
pub async fn serve(app: axum::Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Polls `seen` until it holds `n` items or `timeout` has passed: what it held last (the
/// caller's assertion tells the shortfall).
pub async fn wait_for<T>(
    n: usize,
    timeout: std::time::Duration,
    mut seen: impl FnMut() -> Vec<T>,
) -> Vec<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let c = seen();
        if c.len() >= n || tokio::time::Instant::now() > deadline {
            return c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Raises this process's soft open-file limit to its hard limit (load tests hold thousands of
/// sockets); returns the new soft limit.
#[allow(unsafe_code)]
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid struct pointer.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 0;
        }
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        r.rlim_cur
    }
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    // The gateway's state journal keeps its current generation file open between checkpoints;
    // it comes and goes with them and is not a leak.
    let journal = |e: &std::fs::DirEntry| {
        std::fs::read_link(e.path()).is_ok_and(|t| {
            t.extension().is_some_and(|x| x == "log")
                && t.parent()
                    .and_then(|p| p.file_name())
                    .is_some_and(|n| n == "journal")
        })
    };
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.flatten().filter(|e| !journal(e)).count())
        .unwrap_or(0)
}
