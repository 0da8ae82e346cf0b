//! What the engine is told by whoever runs it: the values of the options that shape a run. The
//! gateway derives it from its configuration; the engine never sees a flag.

use std::time::Duration;

use crate::limits::Caps;
use crate::validate::cwd::Roots;

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The bounds on concurrent work and on a thread's transcript.
    pub caps: Caps,
    /// How long a client may leave its run's events unread before it is let go.
    pub client_stall_timeout: Duration,
    /// How long a run goes on without a client (zero: a disconnect ends it).
    pub detach_grace: Duration,
    /// How long an interrupt waits for its answer, in seconds.
    pub interrupt_ttl_secs: u64,
    /// The bytes of a run's events kept for a client that re-attaches.
    pub replay_buffer_bytes: usize,
    /// Image decodes running at once.
    pub max_image_decodes: usize,
    /// Events buffered per run towards a slow client.
    pub channel_capacity: usize,
    /// Where clients' workspaces may be.
    pub workspaces: Roots,
}
