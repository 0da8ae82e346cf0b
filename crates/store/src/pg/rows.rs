//! A thread's row: the document within its bound (`MAX_DOC_BYTES`, as the file store's), written
//! and read. A document found over it is refused by its length, which the server gives without
//! sending the text.

use crate::{StoreError, ThreadDoc, MAX_DOC_BYTES};

/// A thread's document within the bound `$2`, and its length.
pub(super) const LOAD: &str =
    "SELECT CASE WHEN octet_length(doc) <= $2 THEN doc END, octet_length(doc)
    FROM agui_threads WHERE thread_id = $1";

/// [`MAX_DOC_BYTES`] as the database's `integer`.
pub(super) const MAX_DOC: i32 = MAX_DOC_BYTES as i32;

/// The document (within its bound) and the columns kept beside it.
pub(super) struct Columns {
    pub doc: String,
    pub active_run: Option<String>,
    pub pending: i32,
    /// Whom the thread belongs to ([`ThreadDoc::owner_or_user`]).
    pub owner_user: Option<String>,
}

pub(super) fn columns(doc: &ThreadDoc) -> Result<Columns, StoreError> {
    Ok(Columns {
        doc: String::from_utf8(doc.to_stored()?).expect("documents are UTF-8 JSON"),
        active_run: doc.active_run.as_ref().map(|r| r.run_id.clone()),
        pending: i32::try_from(doc.execution.pending.len()).unwrap_or(i32::MAX),
        owner_user: doc.owner_or_user().map(str::to_owned),
    })
}

/// A document as read with its length: one over the bound was not sent, and is refused.
pub(super) fn parse(
    doc: Option<String>,
    len: Option<i32>,
    thread_id: &str,
) -> Result<Option<ThreadDoc>, StoreError> {
    match (doc, len) {
        (None, Some(n)) => Err(StoreError::Invalid(format!(
            "the document has {n} bytes, over the {MAX_DOC_BYTES} a thread may hold"
        ))),
        (doc, _) => doc
            .map(|d| ThreadDoc::from_json(d.as_bytes(), thread_id))
            .transpose(),
    }
}
