//! The admin listener (`--metrics-listen`): `GET /metrics` in the Prometheus text format, and
//! nothing else. It takes no token (a scraper has none); keep it on an address only operators
//! reach. The public listener has no `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::Metrics;

/// OpenMetrics 1.0 text, what `prometheus-client` writes and Prometheus asks for first.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format, for every other client (curl, `promtool check metrics`).
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

async fn scrape(State(m): State<Arc<Metrics>>, headers: HeaderMap) -> Response {
    let open = m.encode();
    let wants_openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    if wants_openmetrics {
        ([(header::CONTENT_TYPE, OPENMETRICS)], open).into_response()
    } else {
        (
            [(header::CONTENT_TYPE, PROMETHEUS_TEXT)],
            to_prometheus_text(&open),
        )
            .into_response()
    }
}

/// OpenMetrics text as the classic Prometheus text format: a counter family is named after its
/// samples (`x_total`, where OpenMetrics says `x`), and there is no `# EOF` or `# UNIT` line.
/// Everything else is the same in both formats (for the families this gateway has: counters,
/// gauges and histograms, without exemplars).
fn to_prometheus_text(open: &str) -> String {
    let mut out = String::with_capacity(open.len() + 256);
    let mut help: Option<&str> = None;
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with("# HELP ") {
            // Written once the family's type is known.
            help = Some(line);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            if let Some(h) = help.take() {
                let text = h["# HELP ".len()..].split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found").into_response()
}

/// The admin router.
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .fallback(not_found)
        .with_state(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_after_their_samples_in_the_prometheus_format() {
        let open = "# HELP a_runs Runs.\n# TYPE a_runs counter\na_runs_total 3\n\
                    # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n\
                    # HELP a_d Took.\n# TYPE a_d histogram\na_d_sum 0.5\na_d_count 1\n\
                    a_d_bucket{le=\"+Inf\"} 1\n# EOF\n";
        assert_eq!(
            to_prometheus_text(open),
            "# HELP a_runs_total Runs.\n# TYPE a_runs_total counter\na_runs_total 3\n\
             # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n\
             # HELP a_d Took.\n# TYPE a_d histogram\na_d_sum 0.5\na_d_count 1\n\
             a_d_bucket{le=\"+Inf\"} 1\n"
        );
    }

    #[test]
    fn the_gateways_own_exposition_converts_without_a_trace_of_openmetrics() {
        let m = Metrics::new();
        m.run_started();
        let text = to_prometheus_text(&m.encode());
        assert!(text.contains("# TYPE agui_runs_started_total counter\nagui_runs_started_total 1"));
        assert!(!text.contains("# EOF"));
        assert!(text.contains("# TYPE agui_active_runs gauge"));
    }
}
