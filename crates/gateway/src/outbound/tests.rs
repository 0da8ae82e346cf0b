//! Connections reused, over TLS too and through a proxy; a half-read answer closes only its own.

use std::convert::Infallible;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

use futures_util::StreamExt as _;
use http_body::Frame;
use http_body_util::{combinators::BoxBody, BodyExt, StreamBody};
use tokio::net::TcpListener;

use super::*;

/// A local HTTP/1.1 server counting the connections it accepts and those that ended. It answers
/// `METHOD /path`, and on `/stream` one chunk, then nothing (an event stream between two events).
pub(crate) struct Server {
    pub url: String,
    accepted: Arc<AtomicUsize>,
    closed: Arc<AtomicUsize>,
}

impl Server {
    pub async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().unwrap());
        let (accepted, closed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (count, ended) = (accepted.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, SeqCst);
                let tls = tls.clone();
                let ended = ended.clone();
                tokio::spawn(async move {
                    match tls {
                        None => serve_one(TokioIo::new(tcp)).await,
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(tcp).await {
                                serve_one(TokioIo::new(s)).await
                            }
                        }
                    }
                    ended.fetch_add(1, SeqCst);
                });
            }
        });
        Server {
            url,
            accepted,
            closed,
        }
    }

    /// The connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }

    /// Waits until `n` connections have ended (the test fails after 10 s).
    pub async fn until_closed(&self, n: usize) {
        let ended = testkit::wait_for(n, Duration::from_secs(10), || {
            vec![(); self.closed.load(SeqCst)]
        })
        .await;
        assert!(ended.len() >= n, "{} connections ended", ended.len());
    }
}

async fn serve_one<IO>(io: IO)
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(answer);
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await;
}

async fn answer(
    req: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, Infallible>>, Infallible> {
    let body = if req.uri().path() == "/stream" {
        let first = futures_util::stream::iter([Ok(Frame::data(Bytes::from_static(b"first")))]);
        BodyExt::boxed(StreamBody::new(
            first.chain(futures_util::stream::pending()),
        ))
    } else {
        Full::new(Bytes::from(format!(
            "{} {}",
            req.method(),
            req.uri().path()
        )))
        .boxed()
    };
    Ok(Response::new(body))
}

/// A TLS server of a test CA's (its certificate names 127.0.0.1), and a client trusting that CA.
struct Tls {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    acceptor: tokio_rustls::TlsAcceptor,
}

fn tls() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let ca = testkit::tls::Ca::new();
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let path = |name: &str, pem: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    let (cert, key, ca) = (
        path("cert.pem", &cert),
        path("key.pem", &key),
        path("ca.pem", &ca.pem()),
    );
    let acceptor = tls::Reloading::load(&cert, &key)
        .unwrap()
        .acceptor()
        .unwrap();
    Tls {
        _dir: dir,
        ca,
        acceptor,
    }
}

fn client(ca: Option<&Path>, proxy: Option<Matcher>) -> Outbound {
    Outbound::new(Setup {
        ca: ca.map(|p| (p.to_owned(), "--cluster-ca")),
        connect_timeout: Duration::from_secs(3),
        proxy,
    })
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::default()).unwrap()
}

async fn text(client: &Outbound, url: &str) -> String {
    let answer = client.send(get(url)).await.unwrap();
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn requests_to_a_host_reuse_one_connection() {
    let server = Server::start(None).await;
    let client = client(None, None);
    for path in ["/a", "/b", "/c"] {
        let url = format!("{}{path}", server.url);
        assert_eq!(text(&client, &url).await, format!("GET {path}"));
    }
    assert_eq!(server.accepted(), 1);
    // Clones share the pool.
    assert_eq!(text(&client.clone(), &server.url).await, "GET /");
    assert_eq!(server.accepted(), 1);
}

#[tokio::test]
async fn https_requests_reuse_one_connection_checked_against_the_ca() {
    let tls = tls();
    let server = Server::start(Some(tls.acceptor.clone())).await;
    let trusting = client(Some(&tls.ca), None);
    for _ in 0..3 {
        assert_eq!(text(&trusting, &server.url).await, "GET /");
    }
    assert_eq!(server.accepted(), 1);
    // The usual roots do not know the test CA.
    let e = client(None, None).send(get(&server.url)).await.unwrap_err();
    assert!(e.0.starts_with("TLS: invalid peer certificate"), "{e}");
    // No trust to check with: refused before connecting.
    let missing = tls.ca.with_file_name("missing.pem");
    let before = server.accepted();
    let e = client(Some(&missing), None)
        .send(get(&server.url))
        .await
        .unwrap_err();
    assert!(e.0.starts_with("no TLS client (--cluster-ca "), "{e}");
    assert_eq!(server.accepted(), before);
}

/// An answer dropped before its end (a relayed stream whose client left) closes its own
/// connection (the server sees its client go); the next requests get a sound one, and share it.
#[tokio::test]
async fn an_answer_left_half_read_closes_only_its_connection() {
    let server = Server::start(None).await;
    let client = client(None, None);
    let answer = client
        .send(get(&format!("{}/stream", server.url)))
        .await
        .unwrap();
    let mut body = answer.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"first");
    drop(body);
    server.until_closed(1).await;
    for _ in 0..2 {
        assert_eq!(text(&client, &server.url).await, "GET /");
    }
    assert_eq!(server.accepted(), 2);
}

#[tokio::test]
async fn a_host_that_cannot_be_reached_says_why() {
    let port = testkit::free_port();
    let e = client(None, None)
        .send(get(&format!("http://127.0.0.1:{port}/")))
        .await
        .unwrap_err();
    assert!(e.0.starts_with("connect: "), "{e}");
}

/// A proxy that tunnels each `CONNECT` to its target, remembering the request lines.
async fn proxy() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let lines = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let lines = lines.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                while !head.ends_with(b"\r\n\r\n") {
                    let mut b = [0u8; 1];
                    if tcp.read(&mut b).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let head = String::from_utf8(head).unwrap();
                let line = head.lines().next().unwrap().to_owned();
                lines.lock().unwrap().push(line.clone());
                let target = line.split(' ').nth(1).unwrap().to_owned();
                let mut upstream = TcpStream::connect(target).await.unwrap();
                tcp.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tcp, &mut upstream).await;
            });
        }
    });
    (url, seen)
}

#[tokio::test]
async fn an_https_host_is_reached_through_the_proxy_the_environment_names() {
    let tls = tls();
    let server = Server::start(Some(tls.acceptor.clone())).await;
    let plain = Server::start(None).await;
    let (proxy_url, seen) = proxy().await;
    let env = |no: &'static str| {
        let proxy_url = proxy_url.clone();
        move |k: &str| match k {
            "https_proxy" => Some(proxy_url.clone()),
            "NO_PROXY" => Some(no.to_owned()),
            _ => None,
        }
    };
    let through = client(Some(&tls.ca), Some(env_proxy(&env("example.org"))));
    for _ in 0..2 {
        assert_eq!(text(&through, &server.url).await, "GET /");
    }
    // One tunnel, reused.
    let authority = server.url.trim_start_matches("https://");
    assert_eq!(
        *seen.lock().unwrap(),
        [format!("CONNECT {authority} HTTP/1.1")]
    );
    // Plain http, and a host NO_PROXY names, go straight.
    assert_eq!(text(&through, &plain.url).await, "GET /");
    let straight = client(Some(&tls.ca), Some(env_proxy(&env("127.0.0.1"))));
    assert_eq!(text(&straight, &server.url).await, "GET /");
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert_eq!(server.accepted(), 2);
}

#[tokio::test]
async fn a_proxy_that_refuses_the_tunnel_is_named() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let mut b = [0u8; 512];
            let _ = tcp.read(&mut b).await;
            let _ = tcp
                .write_all(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                .await;
        }
    });
    let env = move |k: &str| (k == "ALL_PROXY").then(|| url.clone());
    let e = client(None, Some(env_proxy(&env)))
        .send(get("https://127.0.0.1:9/"))
        .await
        .unwrap_err();
    assert_eq!(
        e.0,
        "proxy CONNECT refused: HTTP/1.1 407 Proxy Authentication Required"
    );
}
