//! `iac-code-agui`: an AG-UI gateway (HTTP + SSE) in front of iac-code's A2A execution kernel.
//!
//! Data flow: `server` and `api` (host, authentication, bounds, the JSON error envelope) → the
//! `engine` crate (validation, admission, the run's driver, the mapping to AG-UI events) → the
//! kernel (`kernel`, `a2a`) and the thread state (`store`); a request for a thread another
//! instance holds goes there through `forward`. The modules that are public are those the binary
//! and the integration tests use.

pub mod api;
pub mod app;
pub mod auth;
mod capabilities;
pub mod config;
mod connect;
mod console;
pub mod edge;
pub mod egress;
pub mod error;
pub mod forward;
mod health;
mod history;
mod observe;
pub mod outbound;
pub mod telemetry;
pub mod tenancy;
mod thread_edit;
mod threads_api;
mod urls;
