//! The probes: `GET`/`HEAD /health` (what the gateway speaks, its version and its kernel's state),
//! `/live` (the process answers) and `/ready` (it would take a run now). They answer anyone
//! (probes carry no token); what the process is and where its kernel came from (its pid, a start
//! failure naming the command) only a caller who may use the gateway sees on `/health`.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use engine::run::Runtime;

/// How long the state store may take to say whether it can be written.
const STORE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

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
    json_answer(StatusCode::OK, &body)
}

/// `/live`: the process is up and its runtime answers; nothing else is asked, so a kernel or a
/// database that is down never gets the gateway restarted.
pub fn live() -> Response {
    json_answer(StatusCode::OK, &json!({"status": "ok"}))
}

/// `/ready`: 200 while the gateway would take a run, 503 while no kernel is ready, while it
/// shuts down, or while its state store cannot be written.
pub async fn ready(rt: &Runtime) -> Response {
    let draining = rt.shutdown().is_draining();
    let (kernel, store) = tokio::join!(rt.kernels().ready(), async {
        match tokio::time::timeout(STORE_CHECK, rt.threads().store().documents().reachable()).await
        {
            Ok(r) => r,
            Err(_) => Err("the state store did not answer".to_owned()),
        }
    });
    if let Err(why) = &store {
        // The reason stays in the log: the probe's caller is anyone.
        tracing::debug!(reason = %why, "not ready: the state store");
    }
    let (status, body) = readiness(draining, kernel, store.is_ok());
    json_answer(status, &body)
}

/// What `/ready` answers: the reasons it is not, by name (`shutting_down`, `kernel`, `state`).
fn readiness(draining: bool, kernel: bool, store: bool) -> (StatusCode, Value) {
    let reasons: Vec<&str> = [
        (draining, "shutting_down"),
        (!kernel, "kernel"),
        (!store, "state"),
    ]
    .into_iter()
    .filter_map(|(failed, name)| failed.then_some(name))
    .collect();
    match reasons.is_empty() {
        true => (StatusCode::OK, json!({"status": "ready"})),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "unready", "reasons": reasons}),
        ),
    }
}

fn json_answer(status: StatusCode, body: &Value) -> Response {
    // HEAD: the server sends the head only, with the length GET would have.
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_names_every_reason_it_is_not() {
        assert_eq!(
            readiness(false, true, true),
            (StatusCode::OK, json!({"status": "ready"}))
        );
        let unready = |reasons: &[&str]| {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "unready", "reasons": reasons}),
            )
        };
        assert_eq!(readiness(true, true, true), unready(&["shutting_down"]));
        assert_eq!(readiness(false, false, true), unready(&["kernel"]));
        assert_eq!(readiness(false, true, false), unready(&["state"]));
        assert_eq!(
            readiness(true, false, false),
            unready(&["shutting_down", "kernel", "state"])
        );
    }
}
