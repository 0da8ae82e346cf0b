//! The routes that read: `GET /threads/{id}` (a thread's state),
//! `GET /threads/{id}/runs/{run}/events` (a run's events, replayed and followed),
//! `GET /threads/{id}/messages` (its transcript, a page at a time; `history`) and
//! `GET /capabilities` (what the agent can do; `capabilities`).

use super::*;

pub(super) async fn events_route(
    State(s): State<AppState>,
    PathIds((thread_id, run_id)): PathIds<(String, String)>,
    req: Request,
) -> Response {
    let (hl, caller) = match thread_checks(
        &s,
        (req.method(), &path_of(&req), req.headers()),
        EVENTS_ROUTE,
        &thread_id,
    )
    .await
    {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Ok(after) = threads_api::resume_point(req.headers(), req.uri().query()) else {
        return ApiError::new(Code::InvalidInput, msg::BAD_LAST_EVENT_ID).into_response_in(hl);
    };
    if let Some(r) = get_held_elsewhere(
        &s.rt,
        &thread_id,
        req.headers(),
        path_of(&req),
        &caller,
        EVENTS_ROUTE,
        hl,
    )
    .await
    {
        return r;
    }
    match threads_api::events(&s.rt, &caller, &thread_id, &run_id, after, s.heartbeat).await {
        Ok(r) => r,
        Err(e) => e.into_response_in(hl),
    }
}

/// `/threads/{threadId}`: GET reads it, PATCH changes it, DELETE deletes it.
pub(super) async fn thread_route(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    req: Request,
) -> Response {
    if let Some(r) = preflight(&s.rt, &req) {
        return r;
    }
    match *req.method() {
        Method::GET => thread_get(s, thread_id, req).await,
        Method::PATCH => thread_patch(s, thread_id, req).await,
        Method::DELETE => thread_delete(s, thread_id, req).await,
        _ => method_not_allowed(THREAD_METHODS),
    }
}

async fn thread_patch(s: AppState, thread_id: String, req: Request) -> Response {
    let (trace, path) = (req.headers().clone(), path_of(&req));
    let JsonRequest {
        hl,
        caller,
        raw,
        obj,
    } = match json_object(&s.rt, req, &PATCH_RULES).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(e) = crate::run::hold::check_thread_id(&thread_id) {
        return e.into_response_in(hl);
    }
    let patch = match crate::thread_edit::parse_patch(&obj) {
        Ok(p) => p,
        Err(e) => return e.into_response_in(hl),
    };
    // The holder changes it: its summary is what the file store lists.
    let out = Outgoing {
        method: Method::PATCH,
        path: &path,
        headers: &trace,
        body: raw,
        caller: &caller,
    };
    let missing = ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND);
    let route = crate::auth::access::PATCH_ROUTE;
    if let Some(r) = held_elsewhere(&s.rt, &thread_id, out, route, missing, hl).await {
        return r;
    }
    match crate::thread_edit::patch(&s.rt, &caller, &thread_id, patch).await {
        Ok(v) => json_ok(&v),
        Err(e) => e.into_response_in(hl),
    }
}

async fn thread_delete(s: AppState, thread_id: String, req: Request) -> Response {
    let route = crate::auth::access::DELETE_ROUTE;
    let path = path_of(&req);
    let (hl, caller) = match bodiless_checks(&s.rt, req.method(), &path, req.headers(), route).await
    {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Err(e) = crate::run::hold::check_thread_id(&thread_id) {
        return e.into_response_in(hl);
    }
    // The holder deletes it, so that nothing of it stays in its memory.
    let out = Outgoing {
        method: Method::DELETE,
        path: &path,
        headers: req.headers(),
        body: Bytes::new(),
        caller: &caller,
    };
    let missing = ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND);
    if let Some(r) = held_elsewhere(&s.rt, &thread_id, out, route, missing, hl).await {
        return r;
    }
    match crate::thread_edit::delete(&s.rt, &caller, &thread_id).await {
        Ok(v) => json_ok(&v),
        Err(e) => e.into_response_in(hl),
    }
}

/// `POST /agents/state` (`{"threadId"}`; ADK's `appName`, `userId`, `name` and `properties`
/// are accepted and not used: the caller is who authenticated).
pub(super) async fn agents_state_route(State(s): State<AppState>, req: Request) -> Response {
    if let Some(r) = preflight(&s.rt, &req) {
        return r;
    }
    let JsonRequest {
        hl, caller, obj, ..
    } = match json_object(&s.rt, req, &AGENTS_STATE_RULES).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let Some(thread_id) = obj
        .get("threadId")
        .and_then(|v| v.as_str())
        .filter(|t| !t.is_empty())
    else {
        return ApiError::new(Code::InvalidInput, msg::STATE_REQUEST_FIELDS).into_response_in(hl);
    };
    // The transcript is in the shared store: any instance answers, none forwards.
    match crate::history::agents_state(&s.rt, &caller, thread_id).await {
        Ok(v) => json_ok(&v),
        Err(e) => e.into_response_in(hl),
    }
}

async fn thread_get(s: AppState, thread_id: String, req: Request) -> Response {
    let (hl, caller) = match thread_checks(
        &s,
        (req.method(), &path_of(&req), req.headers()),
        THREAD_ROUTE,
        &thread_id,
    )
    .await
    {
        Ok(x) => x,
        Err(r) => return r,
    };
    if let Some(r) = get_held_elsewhere(
        &s.rt,
        &thread_id,
        req.headers(),
        path_of(&req),
        &caller,
        THREAD_ROUTE,
        hl,
    )
    .await
    {
        return r;
    }
    match threads_api::thread(&s.rt, &caller, &thread_id).await {
        Ok(v) => json_ok(&v),
        Err(e) => e.into_response_in(hl),
    }
}

pub(super) async fn connect_route(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    req: Request,
) -> Response {
    let route = crate::auth::access::CONNECT_ROUTE;
    let (hl, caller) = match thread_checks(
        &s,
        (req.method(), &path_of(&req), req.headers()),
        route,
        &thread_id,
    )
    .await
    {
        Ok(x) => x,
        Err(r) => return r,
    };
    let q = match crate::connect::connect_query(req.headers(), req.uri().query()) {
        Ok(q) => q,
        Err(e) => return e.into_response_in(hl),
    };
    // A running run's events are in its holder's memory: ask the holder.
    if let Some(r) = get_held_elsewhere(
        &s.rt,
        &thread_id,
        req.headers(),
        path_of(&req),
        &caller,
        route,
        hl,
    )
    .await
    {
        return r;
    }
    match crate::connect::connect(&s.rt, &caller, &thread_id, q, s.heartbeat).await {
        Ok(r) => r,
        Err(e) => e.into_response_in(hl),
    }
}

pub(super) async fn list_route(State(s): State<AppState>, req: Request) -> Response {
    let route = crate::auth::access::LIST_ROUTE;
    let (hl, caller) =
        match get_checks(&s.rt, req.method(), &path_of(&req), req.headers(), route).await {
            Ok(x) => x,
            Err(r) => return r,
        };
    let q = match crate::history::list_query(req.uri().query(), &caller) {
        Ok(q) => q,
        Err(e) => return e.into_response_in(hl),
    };
    match crate::history::list(&s.rt, q).await {
        Ok(v) => json_ok(&v),
        Err(e) => e.into_response_in(hl),
    }
}

pub(super) async fn messages_route(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    req: Request,
) -> Response {
    let route = crate::auth::access::MESSAGES_ROUTE;
    let (hl, caller) = match thread_checks(
        &s,
        (req.method(), &path_of(&req), req.headers()),
        route,
        &thread_id,
    )
    .await
    {
        Ok(x) => x,
        Err(r) => return r,
    };
    let q = match crate::history::page_query(req.uri().query()) {
        Ok(q) => q,
        Err(e) => return e.into_response_in(hl),
    };
    // The transcript is in the shared store: any instance answers, none forwards.
    match crate::history::messages(&s.rt, &caller, &thread_id, q).await {
        Ok(v) => json_ok(&v),
        Err(e) => e.into_response_in(hl),
    }
}

/// The checks of a GET route of one thread: preflight, method and token, then the bound of the
/// thread id (one beyond it is a thread that cannot exist).
#[allow(clippy::result_large_err)]
async fn thread_checks(
    s: &AppState,
    (method, path, headers): (&Method, &str, &HeaderMap),
    route: &'static str,
    thread_id: &str,
) -> Result<(Lang, Caller), Response> {
    let (hl, caller) = get_checks(&s.rt, method, path, headers, route).await?;
    crate::run::hold::check_thread_id(thread_id).map_err(|e| e.into_response_in(hl))?;
    Ok((hl, caller))
}

fn json_ok(v: &serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).expect("serialises"),
    )
        .into_response()
}

pub(super) async fn capabilities_route(State(s): State<AppState>, req: Request) -> Response {
    let route = "GET /capabilities";
    if let Err(r) = get_checks(&s.rt, req.method(), &path_of(&req), req.headers(), route).await {
        return r;
    }
    let body = crate::capabilities::answer(&s.rt).await;
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
