//! `GET /capabilities` (its answer: `crate::capabilities`).

use axum::extract::State;
use axum::response::Response;

use super::extract::Authed;
use super::rules::CapabilitiesRoute;
use super::{json_ok, AppState};

pub(super) async fn capabilities(
    State(s): State<AppState>,
    who: Authed<CapabilitiesRoute>,
) -> Response {
    json_ok(&crate::capabilities::answer(&s.rt, &s.card, &who.caller).await)
}
