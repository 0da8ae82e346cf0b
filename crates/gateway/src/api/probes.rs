//! The probes' routes: `GET`/`HEAD /health`, `/live` and `/ready` (their answers: `health`).
//! They answer anyone and any host; `/health` shows the kernel's process only to an operator
//! whose request names an allowed host.

use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use super::{host_allowed, AppState};

pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/health", get(health))
        .route("/live", get(|| async { crate::health::live() }))
        .route("/ready", get(ready))
}

async fn health(State(s): State<AppState>, req: Request) -> Response {
    // Probes send any Host (a service's name, a pod's): they get the answer; a request for a host
    // that is not allowed gets what a caller without the token gets.
    let (cfg, h) = (&s.cfg, req.headers());
    let operator = s.auth.authenticate(h).await.is_ok_and(|c| c.is_operator());
    crate::health::answer(&s.rt, operator && host_allowed(cfg, req.uri(), h))
}

async fn ready(State(s): State<AppState>) -> Response {
    crate::health::ready(&s.rt).await
}
