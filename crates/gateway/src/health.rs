//! `GET`/`HEAD /health`: what the gateway speaks, its version and its kernel's state. It answers
//! anyone (probes carry no token); what the process is and where its kernel came from (its pid, a
//! start failure naming the command) only a caller who may use the gateway sees.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::run::Runtime;

/// The answer, for a caller who is `authorized` (or not).
pub fn answer(rt: &Runtime, authorized: bool) -> Response {
    let kernel = rt.kernels().health(!authorized);
    let mut body = json!({
        "status": "ok",
        "protocol": "ag-ui",
        "protocolPackageVersion": "0.1.20",
        // The versions a client may declare in `protocolVersion`; without one it gets the
        // pre-1.0 wire of `protocolPackageVersion`.
        "protocolVersions": agui::SUPPORTED_VERSIONS,
        "executionKernel": "a2a-1.0",
        "serverVersion": env!("CARGO_PKG_VERSION"),
        "kernel": kernel,
    });
    // Which of several instances answered (a shared store): for the operator, as the pid.
    if let Some(me) = rt.threads().store().instance_id().filter(|_| authorized) {
        body["instance"] = json!(me);
    }
    // HEAD: the server sends the head only, with the length GET would have.
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
