//! The latency apparatus: a lean SSE reader and the paced streams, through the gateway or straight
//! from the kernel (the floor).

use super::*;

/// Reads an SSE body whose events end with `sep`; calls `on_event` with each event's data.
pub(crate) async fn read_events(
    resp: reqwest::Response,
    sep: &[u8],
    mut on_event: impl FnMut(&[u8]),
) -> Result<usize> {
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut events = 0;
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk?);
        let mut start = 0;
        while let Some(p) = buf[start..].windows(sep.len()).position(|w| w == sep) {
            let rec = &buf[start..start + p];
            // `id: <n>` comes first in the gateway's records.
            let rec = match rec.strip_prefix(b"id: ") {
                Some(rest) => rest
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(&rest[rest.len()..], |nl| &rest[nl + 1..]),
                None => rec,
            };
            if let Some(json) = rec.strip_prefix(b"data: ") {
                events += 1;
                on_event(json);
            }
            start += p + sep.len();
        }
        buf.drain(..start);
    }
    Ok(events)
}

/// The latency client: posts `body` to `path` on a plain TCP connection (`Connection: close`) and
/// returns, for each event after the first `skip`, the read time minus the send time (µs) that
/// follows `key` in the event. No HTTP client stack: one task, one read per wake-up, a substring
/// search per read — so that the apparatus costs as little as possible next to what it measures.
pub(crate) async fn latency_stream(
    addr: &str,
    path: &str,
    body: &str,
    key: &[u8],
    skip: u64,
    expect: usize,
) -> Result<Vec<u64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await?;
    let finder = memchr::memmem::Finder::new(key);
    let mut lat = Vec::with_capacity(expect);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let mut seen = 0u64;
    let mut status_checked = false;
    loop {
        let n = tcp.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        let now = now_micros();
        buf.extend_from_slice(&chunk[..n]);
        if !status_checked {
            if buf.len() < 12 {
                continue;
            }
            if !buf.starts_with(b"HTTP/1.1 200") {
                bail!("{}", String::from_utf8_lossy(&buf[..buf.len().min(200)]));
            }
            status_checked = true;
        }
        let mut at = 0;
        loop {
            let Some(p) = finder.find(&buf[at..]) else {
                // Keep what may be the start of a key.
                at = buf.len().saturating_sub(key.len() - 1).max(at);
                break;
            };
            let start = at + p + key.len();
            let Some(end) = memchr::memchr(b'"', &buf[start..]) else {
                at += p;
                break;
            };
            let ts = std::str::from_utf8(&buf[start..start + end])
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
            if let Some(ts) = ts {
                seen += 1;
                if seen > skip {
                    lat.push(now.saturating_sub(ts));
                }
            }
            at = start + end + 1;
        }
        buf.drain(..at);
    }
    if (seen as usize) < expect {
        bail!("latency stream ended after {seen} of {expect} events");
    }
    Ok(lat)
}

/// p50 and p99 of samples.
pub(crate) fn percentiles(mut all: Vec<u64>) -> (f64, f64) {
    all.sort_unstable();
    if all.is_empty() {
        return (0.0, 0.0);
    }
    (
        all[all.len() / 2] as f64,
        all[(all.len() * 99 / 100).min(all.len() - 1)] as f64,
    )
}

/// The latency test straight from the synthetic kernel to the client (no gateway).
pub(crate) async fn direct_latency(kernel: &SyntheticKernel, z: Sizes) -> Result<(f64, f64)> {
    let per = z.lat_rate * z.lat_secs;
    let interval = 1_000_000 / z.lat_rate;
    let mut tasks = vec![];
    for i in 0..z.lat_streams {
        let addr = kernel.addr.to_string();
        tasks.push(tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": i, "method": "SendStreamingMessage",
                "params": {"message": {"contextId": format!("direct-{i}"), "role": "ROLE_USER",
                "parts": [{"text": format!("paced:{per}:{interval}")}]}}});
            latency_stream(
                &addr,
                "/",
                &body.to_string(),
                b"\"text\":\"",
                100,
                per as usize,
            )
            .await
        }));
    }
    let mut all = vec![];
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(percentiles(all))
}
