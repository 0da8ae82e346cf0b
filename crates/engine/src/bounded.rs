//! The bound of every id and short free string a request names (a leaf: the validation, the
//! stores, the authentication and the routes all check it).

/// The most bytes (UTF-8) an id or a short free string of a request may have. Ids are kept in
/// memory, in every log line of their run and in the thread document: without a bound one
/// request could make a document too large to load again, and a PostgreSQL key too large to
/// index.
pub const MAX_ID_BYTES: usize = 256;

/// Whether `s` is a usable id or short free string: at most [`MAX_ID_BYTES`] bytes, without
/// control characters (C0, DEL and C1: U+0000–U+001F, U+007F–U+009F). A NUL cannot be stored by
/// PostgreSQL, and the others would forge or break log lines. Format characters (zero-width
/// joiners, direction marks) are letters of real names and are accepted: logs and documents
/// carry them escaped.
pub fn is_bounded(s: &str) -> bool {
    s.len() <= MAX_ID_BYTES && !s.chars().any(char::is_control)
}
