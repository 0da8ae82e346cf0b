//! The console's routes (`/console`, `/console/`, `/console/{file}`), when it is served on the
//! listener: its page and assets (`crate::console`).

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::{plain, AppState};

/// `auth`: the gateway asks for a token; `admin`: served on the admin listener (its `/metrics`
/// is the page's own origin).
pub(super) fn routes(auth: bool, admin: bool) -> Router<AppState> {
    let console = Arc::new(crate::console::Console::new(auth, admin));
    let page = move |req: Request| {
        let console = console.clone();
        async move {
            let (method, path) = (req.method(), req.uri().path());
            console
                .answer(method, path, req.headers())
                .unwrap_or_else(|| plain(StatusCode::NOT_FOUND, "Not Found"))
        }
    };
    Router::new()
        .route("/console", get(page.clone()))
        .route("/console/", get(page.clone()))
        .route("/console/{file}", get(page))
}
