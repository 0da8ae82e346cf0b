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
