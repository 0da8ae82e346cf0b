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

/// [`serve`] over TLS with the certificate `cert` and its key `key` (PEM): the handshakes run
/// on the listener's task, one at a time (a test's few connections).
pub async fn serve_tls(app: axum::Router, cert: &str, key: &str) -> std::net::SocketAddr {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<_, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("TLS server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("addr");
    let tls = TlsListener {
        tcp: listener,
        acceptor: tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)),
    };
    tokio::spawn(async move {
        let _ = axum::serve(tls, app).await;
    });
    addr
}

/// A loopback listener whose connections complete a TLS handshake first.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(stream) = self.acceptor.accept(tcp).await {
                return (stream, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
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
