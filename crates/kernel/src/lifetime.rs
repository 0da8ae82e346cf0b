//! A process the gateway starts (a spawned kernel, the kernel fork server) never outlives it.

use std::process::Command;

/// Has `cmd`'s child get SIGKILL when the thread that spawns it dies (a parent-death signal; on
/// Linux it follows the thread), and give up at once when that happened before the signal was
/// set.
#[allow(unsafe_code)]
pub(crate) fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
