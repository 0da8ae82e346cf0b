//! The body checks of each route that reads a JSON body: its method, size bound and messages.

use axum::http::Method;

use super::{CANCEL_BODY_LIMIT, RUN_BODY_LIMIT};
use crate::auth::access::{CANCEL_ROUTE, RUN_ROUTE};
use crate::error::msg;

/// The messages of one POST route's body checks.
pub(super) struct BodyRules {
    /// The route, as the audit names it.
    pub route: &'static str,
    /// Its method, and the methods its path allows (for a 405).
    pub method: Method,
    pub allow: &'static str,
    pub limit: usize,
    pub too_large: &'static str,
    pub invalid_json: &'static str,
    pub not_object: &'static str,
}

pub(super) const RUN_RULES: BodyRules = BodyRules {
    route: RUN_ROUTE,
    method: Method::POST,
    allow: "POST",
    limit: RUN_BODY_LIMIT,
    too_large: msg::RUN_TOO_LARGE,
    invalid_json: msg::RUN_INVALID_JSON,
    not_object: msg::RUN_NOT_OBJECT,
};

pub(super) const PATCH_RULES: BodyRules = BodyRules {
    route: crate::auth::access::PATCH_ROUTE,
    method: Method::PATCH,
    allow: THREAD_METHODS,
    limit: crate::thread_edit::PATCH_BODY_LIMIT,
    too_large: msg::PATCH_TOO_LARGE,
    invalid_json: msg::PATCH_INVALID_JSON,
    not_object: msg::BAD_PATCH,
};

/// The methods of `/threads/{threadId}`.
pub(super) const THREAD_METHODS: &str = "GET, PATCH, DELETE";

pub(super) const AGENTS_STATE_RULES: BodyRules = BodyRules {
    route: crate::auth::access::AGENTS_STATE_ROUTE,
    method: Method::POST,
    allow: "POST",
    limit: crate::thread_edit::PATCH_BODY_LIMIT,
    too_large: msg::STATE_REQUEST_TOO_LARGE,
    invalid_json: msg::STATE_REQUEST_INVALID_JSON,
    not_object: msg::STATE_REQUEST_FIELDS,
};

pub(super) const OBSERVE_RULES: BodyRules = BodyRules {
    route: crate::auth::access::OBSERVE_ROUTE,
    method: Method::POST,
    allow: "POST",
    limit: CANCEL_BODY_LIMIT,
    too_large: msg::OBSERVE_TOO_LARGE,
    invalid_json: msg::OBSERVE_INVALID_JSON,
    not_object: msg::OBSERVE_FIELDS,
};

pub(super) const CANCEL_RULES: BodyRules = BodyRules {
    route: CANCEL_ROUTE,
    method: Method::POST,
    allow: "POST",
    limit: CANCEL_BODY_LIMIT,
    too_large: msg::CANCEL_TOO_LARGE,
    invalid_json: msg::CANCEL_INVALID_JSON,
    not_object: msg::CANCEL_NOT_OBJECT,
};
