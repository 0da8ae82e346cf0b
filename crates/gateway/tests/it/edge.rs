//! The HTTP edge against what clients do: early answers reach clients that send their whole body
//! before reading (Node's `fetch`, Python's `http.client`), a body that trickles in runs out of
//! time, and the `Host` allow-list (the DNS-rebinding defence).

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{locked_gateway, Builder, TestServer};

/// 13 MiB: over the run route's 12 MiB.
const LARGE: usize = 13 * 1024 * 1024;

/// Node's `fetch` (undici): each request of `plan` (`{url, headers, size, chunked}`, a body of
/// `size` spaces, streamed in 1 MiB pieces when `chunked`), one after the other; what each got.
const NODE_CLIENT: &str = r#"
const plan = JSON.parse(process.argv[1]);
const out = [];
for (const r of plan) {
  const init = { method: "POST", headers: r.headers };
  if (r.chunked) {
    const piece = Buffer.alloc(1 << 20, 0x20);
    let sent = 0;
    init.body = new ReadableStream({
      pull(c) {
        if (sent >= r.size) { c.close(); return; }
        const n = Math.min(piece.length, r.size - sent);
        c.enqueue(piece.subarray(0, n));
        sent += n;
      },
    });
    init.duplex = "half";
  } else {
    init.body = Buffer.alloc(r.size, 0x20);
  }
  try {
    const res = await fetch(r.url, init);
    out.push({ status: res.status, body: await res.text(), connection: res.headers.get("connection") });
  } catch (e) {
    out.push({ error: String(e), cause: String(e.cause) });
  }
}
console.log(JSON.stringify(out));
"#;

/// Python's `http.client`, the same plan (`encode_chunked` for `chunked`).
const PYTHON_CLIENT: &str = r#"
import http.client, json, sys
from urllib.parse import urlparse
out = []
for r in json.loads(sys.argv[1]):
    u = urlparse(r["url"])
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        if r["chunked"]:
            def pieces(n=r["size"]):
                piece = b" " * (1 << 20)
                while n > 0:
                    k = min(n, len(piece))
                    yield piece[:k]
                    n -= k
            c.request("POST", u.path, body=pieces(), headers=r["headers"], encode_chunked=True)
        else:
            c.request("POST", u.path, body=b" " * r["size"], headers=r["headers"])
        res = c.getresponse()
        out.append({"status": res.status, "body": res.read().decode(), "connection": res.getheader("connection")})
    except Exception as e:
        out.append({"error": repr(e)})
    finally:
        c.close()
print(json.dumps(out))
"#;

#[derive(Clone, Copy, Debug)]
enum Client {
    Node,
    Python,
}

/// Runs `client` over `plan`; the answers, in order.
async fn run_client(client: Client, plan: &Value) -> Vec<Value> {
    let mut cmd = match client {
        Client::Node => {
            let mut c = tokio::process::Command::new("node");
            c.args(["--input-type=module", "-e", NODE_CLIENT]);
            c
        }
        Client::Python => {
            let mut c = tokio::process::Command::new("python3");
            c.args(["-c", PYTHON_CLIENT]);
            c
        }
    };
    let out = cmd
        .arg(plan.to_string())
        // The gateway is on loopback: never through a proxy.
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("the client finished")
        .expect("the client runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| {
        panic!(
            "{client:?} client output: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn request(url: &str, headers: Value, size: usize, chunked: bool) -> Value {
    json!({"url": url, "headers": headers, "size": size, "chunked": chunked})
}

/// The error code of an answer the client read (status and JSON body), or what went wrong.
fn answered(r: &Value) -> (u64, String) {
    let Some(status) = r["status"].as_u64() else {
        panic!("no answer: {r}");
    };
    let body: Value = serde_json::from_str(r["body"].as_str().unwrap_or(""))
        .unwrap_or_else(|_| panic!("not a JSON answer: {r}"));
    (status, body["error"]["code"].as_str().unwrap_or("").into())
}

/// A client that writes its whole body before it reads gets the answer the gateway gave before
/// reading it: 413 for a body over the limit (announced, or found while reading a chunked one),
/// 401 without the token, 415 for another content type. Before, the gateway closed the
/// connection under the client's upload, which failed with EPIPE or a reset ("fetch failed").
async fn early_answers_reach(client: Client) {
    let open = Builder::new().kernel_unreachable().start().await;
    let locked = locked_gateway("tok").await;
    let json_type = json!({"content-type": "application/json"});
    // Whether the client saw the answer before its write failed was a race (Node's `fetch` won
    // it about half the time, `http.client` never): each case several times.
    let mut plan = Vec::new();
    let mut want = Vec::new();
    for _ in 0..4 {
        plan.extend([
            request(&open.url, json_type.clone(), LARGE, false),
            request(&open.url, json_type.clone(), LARGE, true),
            request(&locked.url, json_type.clone(), LARGE, false),
            request(
                &open.url,
                json!({"content-type": "text/plain"}),
                LARGE,
                false,
            ),
            request(&open.cancel_url("e"), json_type.clone(), 2 << 20, false),
        ]);
        want.extend([
            (413, "REQUEST_TOO_LARGE"),
            (413, "REQUEST_TOO_LARGE"),
            (401, "UNAUTHORIZED"),
            (415, "UNSUPPORTED_MEDIA_TYPE"),
            (413, "REQUEST_TOO_LARGE"),
        ]);
    }
    let got = run_client(client, &Value::from(plan)).await;
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (i, (r, (status, code))) in got.iter().zip(want).enumerate() {
        assert_eq!(
            answered(r),
            (status, code.to_owned()),
            "{client:?} #{i}: {r}"
        );
    }
    // A 413 closes the connection, and says so.
    assert_eq!(got[0]["connection"], "close", "{}", got[0]);
    assert_ne!(got[2]["connection"], "close", "{}", got[2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_fetch_gets_the_early_answer_to_a_large_body() {
    early_answers_reach(Client::Node).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_http_client_gets_the_early_answer_to_a_large_body() {
    early_answers_reach(Client::Python).await;
}

/// Reads from `r` (after what `buf` holds) until a whole answer with a `Content-Length` body is
/// in: (status, head in lower case, JSON body or null).
async fn read_answer<R: AsyncReadExt + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> (u16, String, Value) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |n| n.trim().parse().unwrap());
            if buf.len() >= end + 4 + len {
                let body: Vec<u8> = buf.drain(..end + 4 + len).skip(end + 4).collect();
                let status = head[9..12].parse().unwrap();
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                return (status, head, body);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), r.read(&mut chunk))
            .await
            .expect("an answer within 10 s")
            .unwrap_or(0);
        assert!(n > 0, "EOF before a whole answer");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Whether the peer closes `tcp` within `limit`, sending nothing more.
async fn closes_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let mut chunk = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, tcp.read(&mut chunk)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn connect(s: &TestServer) -> TcpStream {
    TcpStream::connect(s.url.trim_start_matches("http://").trim_end_matches('/'))
        .await
        .unwrap()
}

/// Writes the head of a POST to `/` announcing a body of `length` bytes (no body yet).
async fn send_head(tcp: &mut TcpStream, extra: &str, length: usize) {
    tcp.write_all(&head("/", "localhost", extra, length))
        .await
        .unwrap();
}

fn head(path: &str, host: &str, extra: &str, length: usize) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n{extra}\
         content-length: {length}\r\n\r\n"
    )
    .into_bytes()
}

/// A head announcing a megabyte, then a byte every 100 ms: 408 `BODY_TIMEOUT` once the body
/// timeout has passed since the head, and the connection closes. A body that arrives in pieces
/// within the timeout is read.
#[tokio::test]
async fn a_body_that_trickles_in_runs_out_of_time() {
    let timeout = Duration::from_secs(1);
    let s = Builder::new()
        .kernel_unreachable()
        .config(move |c| c.body_timeout = timeout)
        .start()
        .await;
    let mut tcp = connect(&s).await;
    send_head(&mut tcp, "", 1_000_000).await;
    let start = Instant::now();
    let (status, head_text, body) = {
        let (mut rd, mut wr) = tcp.split();
        let mut buf = Vec::new();
        let answer = read_answer(&mut rd, &mut buf);
        tokio::pin!(answer);
        loop {
            tokio::select! {
                a = &mut answer => break a,
                () = tokio::time::sleep(Duration::from_millis(100)) => {
                    let _ = wr.write_all(b" ").await;
                }
            }
        }
    };
    let took = start.elapsed();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (408, Some("BODY_TIMEOUT")),
        "{head_text} {body}"
    );
    assert_eq!(
        body["error"]["message"],
        "The request body did not arrive in time."
    );
    assert!(head_text.contains("\r\nconnection: close"), "{head_text}");
    assert!(took >= timeout && took < timeout * 4, "{took:?}");
    assert!(closes_within(&mut tcp, Duration::from_secs(3)).await);

    // In pieces, within the timeout: read (and refused as the JSON it is not).
    let mut tcp = connect(&s).await;
    send_head(&mut tcp, "", 4).await;
    for piece in [b"[", b"1", b",", b"2"] {
        tokio::time::sleep(Duration::from_millis(150)).await;
        tcp.write_all(piece).await.unwrap();
    }
    let (status, _, body) = read_answer(&mut tcp, &mut Vec::new()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_JSON"))
    );
}

/// An early answer is sent at once, while the body is still coming; the body is then drained
/// within the linger timeout: a client that stops sending is closed on after it, one that sends
/// its whole body (within 32 MiB) gets its connection back for the next request unless the
/// answer said `Connection: close`.
#[tokio::test]
async fn an_unread_body_is_drained_within_bounds() {
    let linger = Duration::from_secs(1);
    let s = Builder::new()
        .auth("tok")
        .kernel_unreachable()
        .config(move |c| c.linger_timeout = linger)
        .start()
        .await;
    // 20 MiB announced, one byte sent: the 413 comes at once, the close after the linger.
    let mut tcp = connect(&s).await;
    let auth = "authorization: Bearer tok\r\n";
    send_head(&mut tcp, auth, 20 << 20).await;
    tcp.write_all(b"{").await.unwrap();
    let (status, head_text, _) = read_answer(&mut tcp, &mut Vec::new()).await;
    assert_eq!(status, 413);
    assert!(head_text.contains("\r\nconnection: close"), "{head_text}");
    let start = Instant::now();
    assert!(
        !closes_within(&mut tcp, linger / 2).await,
        "closed before the linger timeout"
    );
    assert!(
        closes_within(&mut tcp, linger * 3).await,
        "still open after the linger timeout"
    );
    assert!(start.elapsed() >= linger / 2);

    // Sent whole after its 401: drained, and the connection serves the next request.
    let mut tcp = connect(&s).await;
    let size = 5 << 20;
    send_head(&mut tcp, "", size).await;
    let mut buf = Vec::new();
    let (status, _, body) = read_answer(&mut tcp, &mut buf).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("UNAUTHORIZED"))
    );
    tcp.write_all(&vec![b' '; size]).await.unwrap();
    send_head(&mut tcp, auth, 1).await;
    tcp.write_all(b"[").await.unwrap();
    let (status, _, body) = read_answer(&mut tcp, &mut buf).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("INVALID_JSON"))
    );

    // More than 32 MiB announced: not drained, closed at once.
    let mut tcp = connect(&s).await;
    send_head(&mut tcp, auth, 40 << 20).await;
    tcp.write_all(b"{").await.unwrap();
    let (status, _, _) = read_answer(&mut tcp, &mut Vec::new()).await;
    assert_eq!(status, 413);
    assert!(closes_within(&mut tcp, linger / 2).await);
}

/// A raw request naming `host` (none: no `Host` field, HTTP/1.0); the status and error code.
async fn ask(s: &TestServer, request_line: &str, host: Option<&str>, extra: &str) -> (u16, String) {
    let mut tcp = connect(s).await;
    let host = host.map(|h| format!("host: {h}\r\n")).unwrap_or_default();
    let version = if host.is_empty() { "1.0" } else { "1.1" };
    let req = format!(
        "{request_line} HTTP/{version}\r\n{host}{extra}content-type: application/json\r\n\
         content-length: 1\r\nconnection: close\r\n\r\n["
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let (status, _, body) = read_answer(&mut tcp, &mut Vec::new()).await;
    (
        status,
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
    )
}

/// Without a token, a request naming a host that is not allowed is refused on every route but
/// `/health` (421 `HOST_NOT_ALLOWED`, translated); addresses, loopback names, the configured
/// names and a request naming no host pass; `*` lets any through.
#[tokio::test]
async fn a_foreign_host_is_refused_without_a_token() {
    let s = Builder::new()
        .kernel_unreachable()
        .allowed_host("agui.example.com")
        .allowed_host(".corp.example")
        .start()
        .await;
    let port = s
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_owned();
    let refused = (421, "HOST_NOT_ALLOWED".to_owned());
    for host in [
        "evil.example",
        "evil.example:8000",
        "localhost.evil.example",
        "x.agui.example.com",
    ] {
        assert_eq!(ask(&s, "POST /", Some(host), "").await, refused, "{host}");
    }
    assert_eq!(
        ask(&s, "GET /threads/t", Some("evil.example"), "").await,
        refused
    );
    assert_eq!(
        ask(
            &s,
            "POST /extensions/iac-code/v1/executions/e/cancel",
            Some("evil.example"),
            ""
        )
        .await,
        refused
    );
    assert_eq!(
        ask(&s, "GET /nope", Some("evil.example"), "").await,
        refused
    );
    // Absolute form names its host in the target.
    assert_eq!(
        ask(&s, "POST http://evil.example/", Some("localhost"), "").await,
        refused
    );
    let invalid_json = (400, "INVALID_JSON".to_owned());
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "app.localhost".to_owned(),
        "10.1.2.3:80".to_owned(),
        "AGUI.example.com".to_owned(),
        "corp.example:443".to_owned(),
        "a.b.corp.example".to_owned(),
    ] {
        assert_eq!(
            ask(&s, "POST /", Some(&host), "").await,
            invalid_json,
            "{host}"
        );
    }
    assert_eq!(ask(&s, "POST /", None, "").await, invalid_json);
    // The message says what to do, in the request's language.
    let mut tcp = connect(&s).await;
    tcp.write_all(b"GET /threads/t HTTP/1.1\r\nhost: evil.example\r\naccept-language: fr\r\n\r\n")
        .await
        .unwrap();
    let (_, head_text, body) = read_answer(&mut tcp, &mut Vec::new()).await;
    assert!(
        head_text.contains("content-type: application/json"),
        "{head_text}"
    );
    assert!(head_text.contains("cache-control: no-store"), "{head_text}");
    assert_eq!(
        body["error"]["message"],
        "Le Host de la requête n'est pas un hôte servi par cette passerelle (voir --allowed-host)."
    );
    // /health answers probes of any name.
    let mut tcp = connect(&s).await;
    tcp.write_all(b"GET /health HTTP/1.1\r\nhost: agui-svc.default.svc\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = read_answer(&mut tcp, &mut Vec::new()).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("ok")));

    let any = Builder::new()
        .kernel_unreachable()
        .allowed_host("*")
        .start()
        .await;
    assert_eq!(
        ask(&any, "POST /", Some("evil.example"), "").await,
        invalid_json
    );
}

/// With a token configured, the token is the check: a request with it passes whatever its host
/// (a proxy's name, say), one without it is 401 (never 421).
#[tokio::test]
async fn with_a_token_the_token_is_the_check() {
    let s = locked_gateway("tok").await;
    assert_eq!(
        ask(
            &s,
            "POST /",
            Some("agui.example.com"),
            "authorization: Bearer tok\r\n"
        )
        .await,
        (400, "INVALID_JSON".to_owned())
    );
    assert_eq!(
        ask(&s, "POST /", Some("agui.example.com"), "").await,
        (401, "UNAUTHORIZED".to_owned())
    );
}

/// `/health` answers a request for a host that is not allowed as it answers a caller without the
/// token: without the kernel's pid.
#[tokio::test]
async fn health_for_a_foreign_host_hides_the_kernels_process() {
    use kernel::{ChildSpec, Kernel, Launch};
    let dir = tempfile::tempdir().unwrap();
    let stub = dir.path().join("kernel-that-never-answers.sh");
    std::fs::write(&stub, "#!/bin/sh\nexec sleep 30\n").unwrap();
    std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let kernel = Kernel::managed(
        ChildSpec {
            launch: Launch::new(stub.to_str().unwrap()),
            ready_timeout: Duration::from_secs(60),
            timeouts: Default::default(),
        },
        None,
    );
    let s = Builder::new().kernel(kernel.clone()).start().await;
    let health = |host: &'static str| {
        let s = &s;
        async move {
            let mut tcp = connect(s).await;
            let req = format!("GET /health HTTP/1.1\r\nhost: {host}\r\n\r\n");
            tcp.write_all(req.as_bytes()).await.unwrap();
            let (status, _, body) = read_answer(&mut tcp, &mut Vec::new()).await;
            assert_eq!(status, 200);
            body["kernel"].clone()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while health("localhost").await["pid"].is_null() {
        assert!(Instant::now() < deadline, "the stub kernel never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let foreign = health("evil.example").await;
    assert_eq!(foreign["state"], "starting");
    assert!(foreign.get("pid").is_none(), "{foreign}");
    kernel.stop().await;
}

/// A chunked body broken on the way (a chunk size that is no number) is not JSON: 400
/// `INVALID_JSON`, not "too large", and the connection closes.
#[tokio::test]
async fn a_broken_chunked_body_is_invalid_not_too_large() {
    let s = Builder::new().kernel_unreachable().start().await;
    for path in ["/", "/extensions/iac-code/v1/executions/e1/cancel"] {
        let mut tcp = connect(&s).await;
        tcp.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
                 transfer-encoding: chunked\r\n\r\n4\r\n{{\"a\"\r\nzz\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = Vec::new();
        let (status, head, body) = read_answer(&mut tcp, &mut buf).await;
        assert_eq!(status, 400, "{path}: {head}");
        assert_eq!(body["error"]["code"], "INVALID_JSON", "{path}: {body}");
        assert!(
            closes_within(&mut tcp, Duration::from_secs(5)).await,
            "{path}"
        );
    }
}
