//! The observer extension's route: `POST /extensions/iac-code/v1/executions/{id}/subscribe`
//! (`observe`), its body checked like a cancellation's, forwarded to the thread's holder with a
//! shared store (its kernel runs the task).

use super::*;
use crate::auth::access::OBSERVE_ROUTE;

pub(super) async fn observe_route(
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
    let trace = req.headers().clone();
    let path = path_of(&req);
    let JsonRequest {
        hl,
        caller,
        raw,
        obj,
    } = match json_object(&rt, req, &OBSERVE_RULES).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let observation = match crate::observe::parse(&obj) {
        Ok(o) => o,
        Err(e) => return e.into_response_in(hl),
    };
    let out = Outgoing {
        method: Method::POST,
        path: &path,
        headers: &trace,
        body: raw,
        caller: &caller,
    };
    let missing = ApiError::new(Code::ExecutionNotFound, msg::EXECUTION_NOT_FOUND);
    let thread_id = observation.thread_id.clone();
    if let Some(r) = held_elsewhere(&rt, &thread_id, out, OBSERVE_ROUTE, missing, hl).await {
        return r;
    }
    match crate::observe::observe(&rt, &caller, &execution_id, observation, hl).await {
        Ok(rx) => sse_response(&s, rx),
        Err(e) => e.into_response_in(hl),
    }
}
