//! A small OTLP/HTTP trace receiver on 127.0.0.1: decodes every `POST /v1/traces` body
//! (protobuf `ExportTraceServiceRequest`) into [`Span`]s a test can look at. It can also answer
//! slowly or with an error status, to show that an exporter in trouble never slows a run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
use prost::Message as _;
use serde_json::Value;

/// One received span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub name: String,
    /// Lowercase hex.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// OTLP span kind (1 internal, 2 server, 3 client).
    pub kind: i32,
    pub attributes: BTreeMap<String, Value>,
    /// Span events (a `tracing` event inside the span): name and attributes.
    pub events: Vec<(String, BTreeMap<String, Value>)>,
    pub trace_state: String,
    /// The resource's `service.name`.
    pub service: String,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }
}

#[derive(Default)]
struct Inner {
    spans: Vec<Span>,
    /// Raw bodies, for tests that look for text anywhere in what was exported.
    bodies: Vec<Bytes>,
    /// Requests seen (whatever was answered).
    requests: usize,
    /// Answer every request with this status (200 when unset).
    status: Option<u16>,
    delay: Duration,
}

/// The running receiver.
#[derive(Clone)]
pub struct OtlpReceiver {
    pub addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn value(v: &Option<AnyValue>) -> Value {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => Value::from(s.clone()),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::BoolValue(b)) => Value::from(*b),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(other) => Value::from(format!("{other:?}")),
        None => Value::Null,
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, Value> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value(&kv.value)))
        .collect()
}

/// Decodes one export request.
pub fn decode(body: &[u8]) -> Result<Vec<Span>, prost::DecodeError> {
    let req = ExportTraceServiceRequest::decode(body)?;
    let mut out = Vec::new();
    for rs in &req.resource_spans {
        let resource = rs
            .resource
            .as_ref()
            .map(|r| attributes(&r.attributes))
            .unwrap_or_default();
        let service = resource
            .get("service.name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                out.push(Span {
                    name: s.name.clone(),
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    kind: s.kind,
                    attributes: attributes(&s.attributes),
                    events: s
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), attributes(&e.attributes)))
                        .collect(),
                    trace_state: s.trace_state.clone(),
                    service: service.clone(),
                });
            }
        }
    }
    Ok(out)
}

async fn traces(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let (status, delay) = {
        let mut g = inner.lock().expect("receiver lock");
        g.requests += 1;
        (g.status, g.delay)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(s) = status {
        return StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    }
    let protobuf = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-protobuf"));
    if !protobuf {
        return StatusCode::UNSUPPORTED_MEDIA_TYPE;
    }
    match decode(&body) {
        Ok(spans) => {
            let mut g = inner.lock().expect("receiver lock");
            g.spans.extend(spans);
            g.bodies.push(body);
            StatusCode::OK
        }
        Err(_) => StatusCode::BAD_REQUEST,
    }
}

impl OtlpReceiver {
    pub async fn start() -> OtlpReceiver {
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new()
            .route("/v1/traces", post(traces))
            .with_state(inner.clone());
        let addr = crate::serve(app).await;
        OtlpReceiver { addr, inner }
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter appends `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers every later request with `status` (`None`: accept again).
    pub fn answer_with(&self, status: Option<u16>) {
        self.inner.lock().expect("receiver lock").status = status;
    }

    /// Waits `delay` before answering each later request.
    pub fn delay(&self, delay: Duration) {
        self.inner.lock().expect("receiver lock").delay = delay;
    }

    pub fn spans(&self) -> Vec<Span> {
        self.inner.lock().expect("receiver lock").spans.clone()
    }

    pub fn requests(&self) -> usize {
        self.inner.lock().expect("receiver lock").requests
    }

    /// Every accepted body, as lossy text (for a search for text that must not be there).
    pub fn raw_text(&self) -> String {
        let g = self.inner.lock().expect("receiver lock");
        g.bodies
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    /// Waits until the spans received satisfy `done`, or `timeout`; returns them.
    pub async fn wait_for(&self, timeout: Duration, done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || tokio::time::Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
