//! `iac-code-agui`: an AG-UI gateway (HTTP + SSE) in front of iac-code's A2A execution kernel.
//!
//! Data flow: `http` (auth, limits, error envelope, language) → `validate` (envelope, strict
//! `iacCode`, cwd, content) → `run` (admission, per-thread state machine, `store`) → `a2a` client →
//! `mapping` (pure: kernel item → AG-UI events, span balancing) → SSE encoder.

pub mod api;
pub mod app;
pub mod auth;
pub mod capabilities;
pub mod config;
pub mod connect;
pub mod console;
pub mod cors;
pub mod error;
pub mod forward;
pub mod health;
pub mod history;
pub mod hosts;
pub mod observe;
pub mod outbound;
pub mod request_body;
pub mod server;
pub mod telemetry;
pub mod thread_edit;
pub mod threads_api;
pub mod urls;
pub mod write_deadline;
