//! A2A 1.0 JSON-RPC client for the iac-code execution kernel (`iac-code a2a`).
//!
//! JSON-RPC 2.0 over HTTP POST to a loopback base URL, with `A2A-Version: 1.0` and an optional
//! bearer token on every call. Requests are typed ([`Message`], [`Part`], [`TaskState`], …);
//! answers are read through [`ItemView`] and [`Task`]. Streaming methods answer with SSE
//! (`text/event-stream`), or, when the kernel fails before the first event, with a plain JSON-RPC
//! error body, which is an error and never mistaken for data. Every call has a timeout except the
//! read of a stream itself, which has a silence watchdog instead.
//!
//! - `client`: the calls; unary ones over a small pool, streams over a connection each.
//! - `stream`: an open stream (hyper's HTTP/1.1 client connection, driven by its reader).
//! - `sse`: the bounded SSE decoder.
//! - `wire`: the typed requests; `item`: the typed view of answers; `error`: errors and their
//!   classifiers.
#![forbid(unsafe_code)]

mod client;
mod error;
mod item;
pub mod sse;
mod stream;
mod wire;

use serde_json::Value;

pub use client::{Client, Observer, RestoreOutcome, Timeouts, POOL_IDLE_PER_KERNEL};
pub use error::{Error, RpcError};
pub use item::{ItemView, Task};
#[doc(hidden)]
pub use stream::decode_response_pieces;
pub use stream::{EventStream, Next};
pub use wire::{
    Message, MessageMetadata, Part, PermissionAnswer, PermissionDecision, Role, TaskState,
    Thinking, TurnMetadata,
};

/// The `result` of a JSON-RPC response, or its error.
fn rpc_result(mut body: Value) -> Result<Value, Error> {
    if let Some(err) = body.get("error").filter(|e| !e.is_null()) {
        return Err(Error::Rpc(RpcError::from_value(err)));
    }
    match body.get_mut("result") {
        Some(r) => Ok(r.take()),
        None => Err(Error::Protocol("JSON-RPC response without result".into())),
    }
}
