//! `/threads/{threadId}`: `GET` reads its state (`threads_api::thread`), `PATCH` renames or
//! archives it and `DELETE` deletes it (`thread_edit`), at its holder with a shared store (the
//! holder keeps the summary the file store lists, and forgets what it holds of a deleted thread).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};

use super::super::extract::{Authed, JsonBody};
use super::super::ids::PathIds;
use super::super::relay::{held_elsewhere, Outgoing};
use super::super::rules::{DeleteRoute, PatchRoute, ThreadRoute};
use super::super::{json_ok, Answer, AppState, Refusal};
use super::{checked, get_held_elsewhere};
use crate::auth::access::{DELETE_ROUTE, PATCH_ROUTE, THREAD_ROUTE};
use crate::error::{msg, ApiError, Code};

pub(in crate::api) async fn get(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    uri: Uri,
    headers: HeaderMap,
    Authed { hl, caller, .. }: Authed<ThreadRoute>,
) -> Answer {
    checked(&thread_id, hl)?;
    let elsewhere = get_held_elsewhere(&s, &thread_id, &headers, &uri, &caller, THREAD_ROUTE, hl);
    if let Some(r) = elsewhere.await {
        return Ok(r);
    }
    let v = crate::threads_api::thread(&s.rt, &caller, &thread_id)
        .await
        .or_answer(hl)?;
    Ok(json_ok(&v))
}

pub(in crate::api) async fn patch(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    uri: Uri,
    headers: HeaderMap,
    Authed { hl, caller, .. }: Authed<PatchRoute>,
    JsonBody { raw, obj, .. }: JsonBody<PatchRoute>,
) -> Answer {
    checked(&thread_id, hl)?;
    let patch = crate::thread_edit::parse_patch(&obj).or_answer(hl)?;
    let out = Outgoing::of(Method::PATCH, &uri, &headers, raw, &caller);
    let missing = ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND);
    if let Some(r) = held_elsewhere(&s, &thread_id, out, PATCH_ROUTE, missing, hl).await {
        return Ok(r);
    }
    let v = crate::thread_edit::patch(&s.rt, &caller, &thread_id, patch)
        .await
        .or_answer(hl)?;
    Ok(json_ok(&v))
}

pub(in crate::api) async fn delete(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    uri: Uri,
    headers: HeaderMap,
    Authed { hl, caller, .. }: Authed<DeleteRoute>,
) -> Answer {
    checked(&thread_id, hl)?;
    // The holder deletes it, so that nothing of it stays in its memory.
    let out = Outgoing::of(Method::DELETE, &uri, &headers, Bytes::new(), &caller);
    let missing = ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND);
    if let Some(r) = held_elsewhere(&s, &thread_id, out, DELETE_ROUTE, missing, hl).await {
        return Ok(r);
    }
    let v = crate::thread_edit::delete(&s.rt, &caller, &thread_id)
        .await
        .or_answer(hl)?;
    Ok(json_ok(&v))
}
