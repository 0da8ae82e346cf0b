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
//! - **Another process's limits, priority and scheduling** (`prlimit64`, `setpriority`,
//!   `ioprio_set`, `sched_setaffinity`, `sched_setscheduler`, `sched_setparam`,
//!   `sched_setattr` naming a process other than the caller, or every process of its uid):
//!   Linux lets a uid change its own processes', and Landlock does not govern it, so one user's
//!   agent could lower the limits or the priority of another user's kernel, of the kernel fork
//!   server (whose children inherit them) or of a gateway of the same uid. A process changes
//!   its own (pid 0, as `setrlimit`, `nice` and `os.sched_setaffinity(0, ...)` do).
//!
//! Each is answered `EACCES`, as a denial of Landlock's is. The filter is compiled in the
//! parent (`seccompiler`); the child only hands it to the kernel.

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The x32 ABI's system call numbers on x86_64 (the filter's architecture check does not tell
/// them apart): its `socket`, `io_uring_setup` and the calls on other processes above are
/// refused outright.
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
    // The first argument a process other than the caller: pid 0 is the caller.
    let other = |arg: u8| -> Result<Vec<SeccompRule>, String> {
        Ok(vec![rule(vec![cond(arg, SeccompCmpOp::Ne, 0)?])?])
    };
    // (which, who): who other than the caller, or every process of the caller's uid.
    let others = |by_user: u64| -> Result<Vec<SeccompRule>, String> {
        Ok(vec![
            rule(vec![cond(1, SeccompCmpOp::Ne, 0)?])?,
            rule(vec![cond(0, SeccompCmpOp::Eq, by_user)?])?,
        ])
    };
    const IOPRIO_WHO_USER: u64 = 3;
    let mut rules = vec![
        (libc::SYS_socket, socket),
        (libc::SYS_io_uring_setup, Vec::new()),
        (libc::SYS_io_uring_enter, Vec::new()),
        (libc::SYS_io_uring_register, Vec::new()),
        (libc::SYS_prlimit64, other(0)?),
        (libc::SYS_sched_setaffinity, other(0)?),
        (libc::SYS_sched_setscheduler, other(0)?),
        (libc::SYS_sched_setparam, other(0)?),
        (libc::SYS_sched_setattr, other(0)?),
        (libc::SYS_setpriority, others(libc::PRIO_USER as u64)?),
        (libc::SYS_ioprio_set, others(IOPRIO_WHO_USER)?),
    ];
    #[cfg(target_arch = "x86_64")]
    rules.extend(
        [
            libc::SYS_socket,
            libc::SYS_io_uring_setup,
            libc::SYS_prlimit64,
            libc::SYS_sched_setaffinity,
            libc::SYS_sched_setscheduler,
            libc::SYS_sched_setparam,
            libc::SYS_sched_setattr,
            libc::SYS_setpriority,
            libc::SYS_ioprio_set,
        ]
        .map(|nr| (X32 | nr, Vec::new())),
    );
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
