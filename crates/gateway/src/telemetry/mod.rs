//! Operability: what an operator sees of the gateway.
//!
//! - `metrics`: the Prometheus families (`prometheus-client`), counted with atomics on the hot
//!   path (the admin listener that serves them is `api::admin`).
//! - `access`: one log line per request and the HTTP counters.
//! - `logs`: JSON log lines (`--log-format json`); text is tracing-subscriber's own format.
//! - `otel`: OpenTelemetry traces over OTLP/HTTP, configured by the standard `OTEL_*` variables;
//!   `observer`: the trace context and durations of kernel calls.
//!
//! [`init`] installs the log subscriber (and the trace exporter when asked for); it runs once, in
//! the binary, inside the tokio runtime.

pub mod access;
pub mod logs;
mod metered;
pub mod metrics;
pub mod observer;
mod one_line;
pub mod otel;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

pub use metered::metered;
pub use metrics::{
    DropReason, InterruptEvent, KernelGauges, Limit, Metrics, RunOutcome, SlotGauges,
};

use crate::config::Env;
use crate::config::{Config, LogFormat};
use crate::outbound::Outbound;

/// What [`init`] set up that shutdown must finish: the trace exporter's queue.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// The crates whose spans become trace spans (at info and above).
const TRACED: [&str; 4] = ["iac_code_agui", "engine", "kernel", "a2a"];

/// Installs the global log subscriber: the format and writer of `cfg`, the level of
/// `IAC_CODE_AGUI_LOG` (an `EnvFilter` directive) or `--debug`, and the trace exporter when the
/// environment sets an OTLP endpoint (exported with `client`).
pub fn init(cfg: &Config, env: &Env, metrics: Arc<Metrics>, client: &Outbound) -> Telemetry {
    let level = if cfg.debug { "debug" } else { "info" };
    let filter = env("IAC_CODE_AGUI_LOG")
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| {
            EnvFilter::new(format!(
                "iac_code_agui={level},engine={level},kernel={level},a2a={level},warn"
            ))
        });
    use std::io::IsTerminal as _;
    // Colours for a terminal only: a file or a log collector gets plain text.
    let (writer, ansi) = if cfg.log_stdout {
        (
            BoxMakeWriter::new(std::io::stdout),
            std::io::stdout().is_terminal(),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    };
    let fmt = match cfg.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_target(false)
            .with_ansi(ansi)
            .with_writer(one_line::OneLine::new(writer, ansi))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .fmt_fields(logs::JsonFields)
            .event_format(logs::JsonLines)
            .with_writer(writer)
            .with_filter(filter)
            .boxed(),
    };
    let traces = otel::provider(env, metrics, client);
    let traced = Targets::new().with_targets(TRACED.map(|t| (t, Level::INFO)));
    tracing_subscriber::registry()
        .with(fmt)
        .with(traces.provider.as_ref().map(|p| {
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("iac-code-agui"))
                .with_location(false)
                .with_threads(false)
                .with_target(false)
                .with_tracked_inactivity(false)
                .with_filter(traced)
        }))
        .init();
    if let Some(w) = traces.warning {
        tracing::warn!("{w}");
    }
    Telemetry {
        provider: traces.provider,
    }
}

impl Telemetry {
    /// Exports what the queue still holds (bounded: a down exporter delays the exit by at most
    /// 5 s). The export needs the runtime, so the blocking wait runs off it.
    pub async fn shutdown(self) {
        let Some(p) = self.provider else {
            return;
        };
        let _ =
            tokio::task::spawn_blocking(move || p.shutdown_with_timeout(Duration::from_secs(5)))
                .await;
    }
}

/// Log lines written to memory, for the tests of the log formats.
#[cfg(test)]
mod captured {
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// Where the lines go.
    #[derive(Clone, Default)]
    pub(super) struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `log` logs through `layer` (made with where its lines go).
    pub(super) fn logged<L>(layer: impl FnOnce(Captured) -> L, log: impl FnOnce()) -> String
    where
        L: tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
    {
        let buf = Captured::default();
        let subscriber = tracing_subscriber::registry().with(layer(buf.clone()));
        tracing::subscriber::with_default(subscriber, log);
        let text = buf.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }
}
