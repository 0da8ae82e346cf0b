//! The admin listener (`--metrics-listen`): `GET /metrics` in the Prometheus text format, and
//! `GET`/`HEAD /health` (the public route's answer, as to a caller without the token), `/live` and
//! `/ready` (the public routes' answers), nothing else. It takes no token (a scraper has none); keep it on an address only operators reach. The
//! public listener has no `/metrics`. Its connections are not counted in `--max-connections`, so
//! a probe answers here while the public listener is full.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::prometheus_text;

use super::{admin_routes, plain_405, AppState};
use crate::telemetry::Metrics;

/// OpenMetrics 1.0 text, what Prometheus asks for first.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format (0.0.4), for every other client (curl, `promtool check
/// metrics`). Both are `prometheus-client`'s encodings of the same registry: OpenMetrics alone
/// would not do, as a text-format reader takes an OpenMetrics counter family (`x`, samples
/// `x_total`) for samples without help or type.
pub const PROMETHEUS_TEXT: &str = prometheus_text::CONTENT_TYPE;

async fn scrape(State(m): State<Arc<Metrics>>, headers: HeaderMap) -> Response {
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS)], m.encode()).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            m.encode_prometheus_text(),
        )
            .into_response()
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

/// The admin listener's router: `/metrics`, the probes, and with the console here
/// (`--console admin`) every other path the gateway's.
pub fn router(state: AppState) -> Router {
    let (rt, metrics) = (state.rt.clone(), state.metrics.clone());
    let ready = rt.clone();
    let router = Router::new()
        .route("/metrics", get(scrape))
        .route(
            "/health",
            get(move || async move { crate::health::answer(&rt, false) }),
        )
        .route("/live", get(|| async { crate::health::live() }))
        .route(
            "/ready",
            get(move || async move { crate::health::ready(&ready).await }),
        );
    plain_405(match admin_routes(state) {
        Some(app) => router.fallback_service(app).with_state(metrics),
        None => router.fallback(not_found).with_state(metrics),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::telemetry::Telemetry as _;

    #[test]
    fn the_prometheus_text_names_counters_after_their_samples_and_has_no_trace_of_openmetrics() {
        let m = Metrics::new();
        m.run_started();
        let text = m.encode_prometheus_text();
        assert!(
            text.contains(
                "# TYPE agui_runs_started_total counter\n\
                 agui_runs_started_total 1\n"
            ),
            "{text}"
        );
        assert!(text.contains("# HELP agui_runs_started_total Runs admitted"));
        assert!(text.contains("# TYPE agui_active_runs gauge\nagui_active_runs 1\n"));
        assert!(text.contains("# TYPE agui_run_duration_seconds histogram\n"));
        assert!(text.contains("# TYPE agui_build_info gauge\n"));
        assert!(!text.contains("# EOF"), "{text}");
        assert!(!text.contains("# UNIT"), "{text}");
        assert!(m.encode().ends_with("# EOF\n"));
    }
}
