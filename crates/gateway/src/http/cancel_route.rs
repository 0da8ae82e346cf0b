//! The cancellation extension's route: `POST /extensions/iac-code/v1/executions/{id}/cancel`
//! (its body checked like a run's, its ids bounded before any store or forward sees them).

use super::*;

pub(super) async fn cancel_route(
    State(s): State<AppState>,
    PathIds(execution_id): PathIds<String>,
    req: Request,
) -> Response {
    if execution_id.is_empty() {
        return not_found().await;
    }
    let rt = s.rt.clone();
    if let Some(r) = preflight(&rt, &req) {
        return r;
    }
    // The headers: the trace context, and a forward to the thread's holder.
    let trace = req.headers().clone();
    let path = path_of(&req);
    let JsonRequest {
        hl,
        caller,
        raw,
        obj,
    } = match json_object(&rt, req, &CANCEL_RULES).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let field = |k: &str| obj.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (Some(thread_id), Some(ros)) = (field("threadId"), field("rosInvocationId")) else {
        return ApiError::new(Code::InvalidInput, msg::CANCEL_FIELDS).into_response_in(hl);
    };
    if let Err(e) = cancel::check_ids(&execution_id, thread_id, ros) {
        return e.into_response_in(hl);
    }
    let out = Outgoing {
        method: Method::POST,
        path: &path,
        headers: &trace,
        body: raw,
        caller: &caller,
    };
    let missing = crate::run::cancel::not_found();
    if let Some(r) = held_elsewhere(&rt, thread_id, out, CANCEL_ROUTE, missing, hl).await {
        return r;
    }
    let cancelled = observer::with_incoming(
        otel::client_headers(&trace),
        cancel::cancel(&rt, &caller, &execution_id, thread_id, ros),
    );
    let span = tracing::info_span!("agui.cancel", otel.kind = "server", thread_id, execution_id = %execution_id);
    otel::continue_trace(&span, &trace);
    match tracing::Instrument::instrument(cancelled, span).await {
        Ok(outcome) => {
            let body = json!({"executionId": execution_id, "status": outcome.as_str()});
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                serde_json::to_vec(&body).expect("serialises"),
            )
                .into_response()
        }
        Err(e) => e.into_response_in(hl),
    }
}
