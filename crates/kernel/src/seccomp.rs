//! The system calls Landlock does not see, refused by a seccomp filter that a confined kernel
//! installs with its ruleset (`confine::Prepared::enforce`).
//!
//! - **Sockets of other protocols.** Landlock's TCP rules hold for TCP sockets only; a socket
//!   of the Internet families with another protocol (Multipath TCP, which falls back to plain
//!   TCP against any server; SCTP) would connect and listen on any port. Only protocol 0, TCP
//!   and UDP are let through (UDP: see `confine`).
//! - **UNIX sockets** (`socket(AF_UNIX)`): Landlock up to ABI 7 does not govern connecting to a
//!   pathname socket, and every kernel may share one uid, so another user's agent sockets (a git
//!   credential cache, an ssh or gpg agent in their HOME) and the uid's own services (its
//!   systemd and D-Bus) would answer. `socketpair` stays: the kernel's event loop needs it.
//! - **io_uring**, which opens sockets and files past this filter.
//!
//! Each is answered `EACCES`, as a denial of Landlock's is. The filter is compiled in the
//! parent (`seccompiler`); the child only hands it to the kernel.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The x32 ABI's system call numbers on x86_64 (the filter's architecture check does not tell
/// them apart): its `socket` and `io_uring_setup` are refused outright.
#[cfg(target_arch = "x86_64")]
const X32: i64 = 0x4000_0000;

/// The filter, compiled for this machine's architecture.
pub(crate) fn filter() -> Result<BpfProgram, String> {
    let arch = target_arch()?;
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).map_err(|e| e.to_string())
    };
    let rule = |c: Vec<SeccompCondition>| SeccompRule::new(c).map_err(|e| e.to_string());
    // socket(domain, type, protocol): an Internet socket of another protocol than the default,
    // TCP or UDP; or a UNIX one.
    let mut socket = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        let mut c = vec![cond(0, SeccompCmpOp::Eq, family as u64)?];
        for allowed in [0, libc::IPPROTO_TCP, libc::IPPROTO_UDP] {
            c.push(cond(2, SeccompCmpOp::Ne, allowed as u64)?);
        }
        socket.push(rule(c)?);
    }
    socket.push(rule(vec![cond(
        0,
        SeccompCmpOp::Eq,
        libc::AF_UNIX as u64,
    )?])?);
    let mut rules = vec![
        (libc::SYS_socket, socket),
        (libc::SYS_io_uring_setup, Vec::new()),
        (libc::SYS_io_uring_enter, Vec::new()),
        (libc::SYS_io_uring_register, Vec::new()),
    ];
    #[cfg(target_arch = "x86_64")]
    rules.extend([
        (X32 | libc::SYS_socket, Vec::new()),
        (X32 | libc::SYS_io_uring_setup, Vec::new()),
    ]);
    let f = SeccompFilter::new(
        rules.into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    )
    .map_err(|e| e.to_string())?;
    f.try_into()
        .map_err(|e: seccompiler::BackendError| e.to_string())
}

fn target_arch() -> Result<TargetArch, String> {
    if cfg!(target_arch = "x86_64") {
        Ok(TargetArch::x86_64)
    } else if cfg!(target_arch = "aarch64") {
        Ok(TargetArch::aarch64)
    } else if cfg!(target_arch = "riscv64") {
        Ok(TargetArch::riscv64)
    } else {
        Err("no seccomp filter for this architecture".into())
    }
}
