//! A started kernel process as its supervisor sees it, whichever way it was started: spawned (a
//! child of the gateway's) or forked by the fork server (`zygote`, a child of the zygote's,
//! whose exit the zygote reports). Both lead their own process group, so both are signalled the
//! same way (by process group).

use std::io;
use std::process::{Child, ExitStatus};
use std::time::Duration;

use super::zygote::Forked;

pub(crate) enum Proc {
    Spawned(Child),
    Forked(Forked),
}

impl Proc {
    pub(crate) fn id(&self) -> u32 {
        match self {
            Proc::Spawned(c) => c.id(),
            Proc::Forked(f) => f.id(),
        }
    }

    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        match self {
            Proc::Spawned(c) => c.try_wait(),
            Proc::Forked(f) => f.try_wait(),
        }
    }

    /// Waits for its exit (after a SIGKILL: briefly).
    pub(crate) fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Proc::Spawned(c) => c.wait(),
            Proc::Forked(f) => loop {
                if let Some(status) = f.try_wait()? {
                    return Ok(status);
                }
                std::thread::sleep(Duration::from_millis(20));
            },
        }
    }

    pub(crate) fn forked(&self) -> bool {
        matches!(self, Proc::Forked(_))
    }
}
