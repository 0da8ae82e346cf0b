//! The ids in a route's path, percent-decoded. One that does not decode to UTF-8 (`%FF`) names
//! nothing: it becomes an id no thread, run or execution can have (a control character, which
//! every id check refuses), so the route answers it as any id it does not know, in its own
//! order (authentication first) and in the JSON envelope, never axum's plain-text 400.

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

/// An id no request can name.
const NOBODYS: &str = "\u{0}";

/// The path's ids (`String`, or a pair of them).
pub(super) struct PathIds<T>(pub T);

/// What a path's ids are when they do not decode.
pub(super) trait Nobodys {
    fn nobodys() -> Self;
}

impl Nobodys for String {
    fn nobodys() -> String {
        NOBODYS.to_owned()
    }
}

impl Nobodys for (String, String) {
    fn nobodys() -> (String, String) {
        (NOBODYS.to_owned(), NOBODYS.to_owned())
    }
}

impl<S, T> FromRequestParts<S> for PathIds<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Nobodys + Send,
{
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(PathIds(
            match Path::<T>::from_request_parts(parts, state).await {
                Ok(Path(ids)) => ids,
                Err(_) => T::nobodys(),
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_that_does_not_decode_is_one_no_check_lets_through() {
        assert!(!crate::validate::is_bounded(&String::nobodys()));
        assert!(crate::run::hold::check_thread_id(&String::nobodys()).is_err());
    }
}
