//! OpenTelemetry traces, exported over OTLP/HTTP (protobuf).
//!
//! Configured by the standard variables only, and off unless an endpoint is set
//! (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`). The SDK reads the
//! rest itself: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`,
//! `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS` and `_TIMEOUT`, `OTEL_BSP_*`. `OTEL_SDK_DISABLED=true`
//! and `OTEL_TRACES_EXPORTER=none` switch tracing off; a protocol other than `http/protobuf`
//! is refused with a warning (the only one built in), rather than silently replaced.
//!
//! An exporter that is down, slow or refusing never slows a run: spans wait in a bounded queue
//! (`OTEL_BSP_MAX_QUEUE_SIZE`, 2,048 by default) that the SDK drains on its own thread; ending a
//! span never blocks. A span that finds the queue full is dropped and counted, as is every span of
//! a batch whose export failed (`agui_trace_spans_dropped_total{reason}`).
//!
//! Propagation is W3C trace context: a client's `traceparent`/`tracestate` continue its trace,
//! and the kernel's requests carry the current span's. With tracing off, the client's headers
//! are passed on to the kernel unchanged, so that a traced kernel still joins the client's trace.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_http::{HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanExporter,
    SpanProcessor,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::metrics::{DropReason, Metrics};
use crate::config::Env;
use crate::outbound::Outbound;

/// The tracer provider when tracing is on; why it is off otherwise (`None`: not asked for).
pub struct Tracing {
    pub provider: Option<SdkTracerProvider>,
    pub warning: Option<String>,
}

fn var(env: &Env, k: &str) -> Option<String> {
    env(k)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Builds the tracer provider the environment asks for, exporting with `client`. Call inside the
/// tokio runtime: exports run on it.
pub fn provider(env: &Env, metrics: Arc<Metrics>, client: &Outbound) -> Tracing {
    let endpoint = var(env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| var(env, "OTEL_EXPORTER_OTLP_ENDPOINT"));
    let disabled = var(env, "OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var(env, "OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
    if endpoint.is_none() || disabled {
        return Tracing {
            provider: None,
            warning: None,
        };
    }
    let protocol = var(env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| var(env, "OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(p) = protocol.filter(|p| p != "http/protobuf") {
        return Tracing {
            provider: None,
            warning: Some(format!(
                "OTLP protocol {p:?} is not supported (only http/protobuf): tracing is off"
            )),
        };
    }
    let timeout = var(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| var(env, "OTEL_EXPORTER_OTLP_TIMEOUT"))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis);
    let queue = var(env, "OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|q| *q > 0)
        .unwrap_or(2048);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_timeout(timeout)
        .with_http_client(RuntimeClient::new(client.clone(), timeout))
        .build();
    let exporter = match exporter {
        Ok(e) => e,
        Err(e) => {
            return Tracing {
                provider: None,
                warning: Some(format!(
                    "the OTLP exporter cannot be built: {e}; tracing is off"
                )),
            }
        }
    };
    let in_flight = Arc::new(AtomicUsize::new(0));
    let batch = BatchSpanProcessor::builder(Counted {
        inner: exporter,
        metrics: metrics.clone(),
        in_flight: in_flight.clone(),
    })
    .with_batch_config(
        BatchConfigBuilder::default()
            .with_max_queue_size(queue)
            .build(),
    )
    .build();
    // The sampler and the resource (service name) come from the environment through the SDK's
    // default configuration.
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Gate {
            inner: batch,
            max: queue,
            metrics,
            in_flight,
        })
        .build();
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Tracing {
        provider: Some(provider),
        warning: None,
    }
}

/// Continues the client's trace in `span` (before the span is first entered).
pub fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    // Err when tracing is off: the headers are then passed on as they came (`incoming`).
    let _ = span.set_parent(parent);
}

/// The client's W3C headers, as they came, when they are well formed.
pub fn client_headers(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let Some(parent) = headers.get("traceparent") else {
        return Vec::new();
    };
    // Well formed: the propagator reads a valid context from it.
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut out = vec![(HeaderName::from_static("traceparent"), parent.clone())];
    if let Some(state) = headers.get("tracestate") {
        out.push((HeaderName::from_static("tracestate"), state.clone()));
    }
    out
}

/// The trace headers of a kernel request made now: the current span's context, when tracing
/// is on and the span is sampled into a trace.
pub fn current_headers() -> Vec<(HeaderName, HeaderValue)> {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut map = HeaderMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(&mut map));
    map.into_iter()
        .filter_map(|(k, v)| k.map(|k| (k, v)))
        .collect()
}

/// The gateway's client, its requests run on the gateway's runtime: the SDK exports from a
/// thread of its own (no runtime there), which waits for the spawned request's result.
#[derive(Debug, Clone)]
struct RuntimeClient {
    client: Outbound,
    rt: tokio::runtime::Handle,
    timeout: Duration,
}

impl RuntimeClient {
    fn new(client: Outbound, timeout: Duration) -> RuntimeClient {
        RuntimeClient {
            client,
            rt: tokio::runtime::Handle::current(),
            timeout,
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(
        &self,
        req: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let task = self.rt.spawn(async move {
            tokio::time::timeout(timeout, async move {
                let (parts, body) = client.send(req.map(Full::new)).await?.into_parts();
                let body = Limited::new(body, 1 << 20).collect().await?.to_bytes();
                Ok::<_, HttpError>(http::Response::from_parts(parts, body))
            })
            .await
            .map_err(|_| HttpError::from("OTLP export timed out"))?
        });
        task.await?
    }
}

/// In front of the batch processor: lets at most `max` spans wait, and counts the others, so
/// that every dropped span is counted (the SDK only logs its own drops).
#[derive(Debug)]
struct Gate {
    inner: BatchSpanProcessor,
    max: usize,
    metrics: Arc<Metrics>,
    /// Spans let through and not yet handed to the exporter (shared with [`Counted`]).
    in_flight: Arc<AtomicUsize>,
}

impl SpanProcessor for Gate {
    fn on_start(&self, span: &mut Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx)
    }
    fn on_end(&self, span: SpanData) {
        if self.in_flight.fetch_add(1, Relaxed) >= self.max {
            self.in_flight.fetch_sub(1, Relaxed);
            self.metrics.spans_dropped(DropReason::QueueFull, 1);
            return;
        }
        self.inner.on_end(span)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn shutdown_with_timeout(&self, t: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(t)
    }
    fn set_resource(&mut self, r: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(r)
    }
}

/// Around the exporter: frees the gate's places and counts spans whose export failed.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    metrics: Arc<Metrics>,
    in_flight: Arc<AtomicUsize>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        self.in_flight.fetch_sub(n, Relaxed);
        let metrics = self.metrics.clone();
        let export = self.inner.export(batch);
        async move {
            let r = export.await;
            if r.is_err() {
                metrics.spans_dropped(DropReason::ExportFailed, n as u64);
            }
            r
        }
    }
    fn shutdown_with_timeout(&self, t: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(t)
    }
    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }
    fn set_resource(&mut self, r: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(r)
    }
}
