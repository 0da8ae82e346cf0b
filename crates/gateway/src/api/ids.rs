//! The ids in a route's path, each percent-decoded on its own. One that does not decode to UTF-8
//! (`%FF`) names nothing: it becomes an id no thread, run or execution can have (a control
//! character, which every id check refuses), so the route answers it as any id it does not know
//! (a thread's or a run's, whichever it is), in its own order (authentication first) and in the
//! JSON envelope, never axum's plain-text 400.

use axum::extract::{FromRequestParts, MatchedPath};
use axum::http::request::Parts;

/// An id no request can name.
const NOBODYS: &str = "\u{0}";

/// The path's ids (`String`, or a pair of them), each decoded on its own.
pub(super) struct PathIds<T>(pub T);

/// A route's ids from the path's, in order (one that does not decode is [`NOBODYS`]).
pub(super) trait FromIds: Sized {
    fn from_ids(ids: Vec<String>) -> Self;
}

impl FromIds for String {
    fn from_ids(ids: Vec<String>) -> String {
        ids.into_iter().next().unwrap_or_else(|| NOBODYS.to_owned())
    }
}

impl FromIds for (String, String) {
    fn from_ids(ids: Vec<String>) -> (String, String) {
        let mut ids = ids.into_iter();
        let mut next = || ids.next().unwrap_or_else(|| NOBODYS.to_owned());
        (next(), next())
    }
}

/// A path segment's value percent-decoded, or [`NOBODYS`] when that is not UTF-8.
fn decoded(raw: &str) -> String {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_or_else(|_| NOBODYS.to_owned(), |s| s.into_owned())
}

impl<S, T> FromRequestParts<S> for PathIds<T>
where
    S: Send + Sync,
    T: FromIds + Send,
{
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // The route's pattern (`/threads/{thread_id}/runs/{run_id}/events`) against the raw
        // path, segment by segment: axum's own extractors decode every id at once and fail all
        // of them for one that is not UTF-8.
        let ids = match parts.extensions.get::<MatchedPath>() {
            Some(pattern) => ids_of(pattern.as_str(), parts.uri.path()),
            None => Vec::new(),
        };
        Ok(PathIds(T::from_ids(ids)))
    }
}

/// The ids `path` has where `pattern` has `{…}`, decoded.
fn ids_of(pattern: &str, path: &str) -> Vec<String> {
    pattern
        .split('/')
        .zip(path.split('/'))
        .filter(|(p, _)| p.starts_with('{'))
        .map(|(_, raw)| decoded(raw))
        .collect()
}

/// An execution's id from the path: an empty one (`…/executions//cancel`) names no route, and is
/// answered as one, before anything else.
pub(super) struct ExecutionId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ExecutionId {
    type Rejection = axum::response::Response;

    async fn from_request_parts(parts: &mut Parts, s: &S) -> Result<Self, Self::Rejection> {
        let Ok(PathIds(id)) = PathIds::<String>::from_request_parts(parts, s).await;
        if id.is_empty() {
            return Err(super::not_found().await);
        }
        Ok(ExecutionId(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_is_decoded_on_its_own_and_one_that_is_not_utf8_is_nobodys() {
        assert_eq!(decoded("t%201"), "t 1");
        assert_eq!(decoded("a+b"), "a+b");
        assert_eq!(decoded("%E4%BD%A0"), "你");
        assert_eq!(decoded("%FF"), NOBODYS);
        assert!(!engine::bounded::is_bounded(NOBODYS));
        assert!(engine::run::hold::check_thread_id(NOBODYS).is_err());
        let pattern = "/threads/{thread_id}/runs/{run_id}/events";
        let pair = <(String, String)>::from_ids(ids_of(pattern, "/threads/t%201/runs/%FF/events"));
        assert_eq!(pair, ("t 1".to_owned(), NOBODYS.to_owned()));
        let pair = <(String, String)>::from_ids(ids_of(pattern, "/threads/%FF/runs/r1/events"));
        assert_eq!(pair, (NOBODYS.to_owned(), "r1".to_owned()));
    }
}
