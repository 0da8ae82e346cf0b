//! Requests for a thread another instance holds: sent there and the answer relayed
//! (`forward`), marked as this instance's forward; and the question an instance answers before
//! anything is forwarded to it (`/cluster/v1/hello`).

use crate::error::Respond as _;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::extract::path_and_query;
use super::{not_found, plain, AppState};
use crate::auth::access;
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::forward;
use engine::i18n::Lang;
use engine::run::{Holder, Runtime};
use store::Peer;

/// A request as it goes to the thread's holder.
pub(super) struct Outgoing<'a> {
    pub(super) method: Method,
    /// Its path and query.
    pub(super) path: String,
    pub(super) headers: &'a HeaderMap,
    pub(super) body: Bytes,
    /// Who the client is, as authenticated here (the holder takes it as it is).
    pub(super) caller: &'a Caller,
}

impl<'a> Outgoing<'a> {
    /// The request a route was asked, as it goes on (`uri`: its path and query).
    pub(super) fn of(
        method: Method,
        uri: &Uri,
        headers: &'a HeaderMap,
        body: Bytes,
        caller: &'a Caller,
    ) -> Self {
        let path = path_and_query(uri);
        Outgoing {
            method,
            path,
            headers,
            body,
            caller,
        }
    }
}

/// Answers with what the instance holding the thread answers (a forwarded request is never
/// forwarded again: two instances that disagree about a holder answer 503).
pub(super) async fn to_holder(
    s: &AppState,
    holder: &Peer,
    out: Outgoing<'_>,
    lang: Lang,
) -> Response {
    let unreachable = || ApiError::new(Code::StateUnavailable, msg::HOLDER_UNREACHABLE);
    let rt = &s.rt;
    let forwarded = s.with_trust(|t| forward::is_forwarded(&out.method, &out.path, out.headers, t));
    if forwarded || holder.url.is_empty() {
        return unreachable().into_response_in(lang);
    }
    let store = rt.threads().store();
    let (key, me) = (store.forward_key(), store.instance_id().unwrap_or_default());
    let mark = match s.cfg.cluster_secret.as_deref() {
        Some(secret) => forward::Mark::Signed {
            secret: secret.as_bytes(),
            peers: &s.forwarding.peers,
        },
        None => forward::Mark::Key(key.as_deref().unwrap_or_default()),
    };
    let hop = forward::Hop {
        me: &me,
        caller: out.caller,
        mark,
        client: &s.forwarding.client,
    };
    match forward::forward(holder, out.method, &out.path, out.headers, out.body, &hop).await {
        Ok(r) => r,
        Err(forward::Unreachable(why)) => {
            let url = holder.url.as_str();
            tracing::warn!(holder = url, error = %why, "the thread's holder cannot be reached");
            unreachable().into_response_in(lang)
        }
    }
}

/// With a shared store, a request for a thread another live instance holds goes there (`None`:
/// it is served here).
pub(super) async fn held_elsewhere(
    s: &AppState,
    thread_id: &str,
    out: Outgoing<'_>,
    route: &'static str,
    missing: ApiError,
    lang: Lang,
) -> Option<Response> {
    // A forwarded request is looked up too: one that reached a non-holder (the thread moved
    // meanwhile) is refused by `to_holder`, never served from what this instance has. A mark a
    // client sent itself is no mark (it lacks the cluster's key): such a request is forwarded
    // as any other.
    let rt = &s.rt;
    if !rt.threads().store().shared() {
        return None;
    }
    match rt.threads().holder(thread_id).await {
        Ok(Holder::Here { .. }) => None,
        Ok(Holder::Elsewhere(peer)) => Some(
            match theirs(&s.rt, out.caller, thread_id, route, missing, lang).await {
                Ok(()) => to_holder(s, &peer, out, lang).await,
                Err(r) => r,
            },
        ),
        Err(e) => {
            tracing::warn!(error = %e, "thread state unavailable");
            Some(
                ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
                    .into_response_in(lang),
            )
        }
    }
}

/// Before a request for a thread another instance holds leaves: another user's thread gets
/// `missing` (what the route answers for a thread that does not exist) here, without a forward
/// whose answer or failure could tell it apart.
pub(super) async fn theirs(
    rt: &Runtime,
    caller: &Caller,
    thread_id: &str,
    route: &'static str,
    missing: ApiError,
    lang: Lang,
) -> Result<(), Response> {
    match engine::run::hold::may_touch(rt.threads(), caller, thread_id).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            access::not_theirs(&**rt.metrics(), route, caller, thread_id);
            Err(missing.into_response_in(lang))
        }
        Err(e) => Err(e.into_response_in(lang)),
    }
}

/// `GET /cluster/v1/hello?nonce=…`: with a cluster secret and a shared store, this instance
/// proves it knows the secret (`forward::hello_answer`) to one about to forward to it; else 404.
pub(super) async fn cluster_hello(State(s): State<AppState>, req: Request) -> Response {
    let (Some(secret), Some(me)) = (
        s.cfg.cluster_secret.as_deref(),
        s.rt.threads().store().instance_id(),
    ) else {
        return not_found().await;
    };
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let query = req.uri().query().unwrap_or("");
    let nonce = url::form_urlencoded::parse(query.as_bytes())
        .find_map(|(k, v)| (k == "nonce").then(|| v.into_owned()))
        .unwrap_or_default();
    let url = &s.cfg.advertise_url;
    match forward::hello_answer(secret.as_bytes(), &me, url, &nonce) {
        Some(v) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            v.to_string(),
        )
            .into_response(),
        None => plain(StatusCode::BAD_REQUEST, "Bad Request"),
    }
}
