//! Request validation: everything that can reject a run happens here, before the SSE response.

pub mod content;
pub mod cwd;
pub mod envelope;
pub mod images;
pub mod props;

pub use content::{ImageLimits, UserMessage};
pub use envelope::{Envelope, ResumeEntry, ResumeStatus};
pub use props::{IacCode, RunMode, Secret};

pub use crate::bounded::{is_bounded, MAX_ID_BYTES};
