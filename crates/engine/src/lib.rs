//! The run engine: a validated AG-UI request in, the kernel's A2A turn driven, exactly one
//! terminal event out. It owns its settings ([`Settings`]) and reports through a trait
//! ([`telemetry::Telemetry`]); it never sees a flag, an HTTP route or an exporter.
//!
//! - `validate/`: a request's envelope, content, images and workspace, checked before anything runs.
//! - `run/`: admission, the per-thread registry, the driver of a run, replays, cancellation.
//! - `mapping/`: the kernel's events into AG-UI events.
//! - `caller`: who a request comes from and which threads they may touch.
//! - `limits`, `shutdown`: the bounds on concurrent work; the drain signal and activity.
//! - `canonical`, `i18n`, `error`: the Python-identical canonical JSON, the message catalogue,
//!   the errors a run ends with.

pub mod bounded;
pub mod caller;
pub mod canonical;
pub mod error;
pub mod i18n;
pub mod limits;
pub mod mapping;
pub mod paths;
pub mod run;
mod settings;
pub mod shutdown;
pub mod telemetry;
pub mod trace;
pub mod validate;

pub use settings::Settings;
