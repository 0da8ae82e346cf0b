//! The run core's decisions, as pure functions of values (the thread document, the request, the
//! kernel's view of a task, the time): no I/O, so each is unit- and property-tested directly.
//! The callers (`admit`, `cancel`, `driver/`) do the loading, saving and kernel calls around them.

pub mod admission;
pub mod answer;
pub mod expiry;
pub mod resume;
#[cfg(test)]
pub(crate) mod testing;
