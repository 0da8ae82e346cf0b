//! A kernel's confinement by Landlock: the primitive of per-user kernel isolation. A kernel runs
//! one user's agent, whose tools (bash, the file tools) run what a model says, so it must reach
//! that user's files and none of another user's, nor the gateway's state, configuration or TLS
//! keys, even when every kernel runs under the gateway's own uid (root too: Landlock is not a
//! permission check that root bypasses).
//!
//! A [`Confinement`] is the rules as plain data: the paths the kernel may read and write (the
//! user's workspace, the kernel's HOME, configuration, session-backup and persistence directories,
//! TMPDIR), the paths it may read and execute (the system's and its own installation:
//! [`Confinement::runtime`]), the TCP ports it may connect to and bind. Everything else on the
//! file system is denied; so are signals to a process outside the kernel's Landlock domain and
//! connections to an abstract UNIX socket of one (scopes), and ptrace of one (always, under
//! Landlock: hence no `/proc/<pid>/environ` of another kernel or the gateway). Every capability
//! is dropped (a root kernel's CAP_SYS_ADMIN would read other processes' `/proc/<pid>/environ`
//! past Landlock) and `no_new_privs` set, so no setuid program gives any back.
//!
//! All or nothing: a machine that cannot enforce every rule (Landlock missing or disabled, or an
//! ABI older than 6) is refused with what it lacks ([`check_supported`]), and the ruleset is built
//! with the crate's hard requirement, so a rule that the running kernel would drop is an error,
//! never a weaker sandbox.
//!
//! Parent and child: building a ruleset allocates and opens files, which a child must not do
//! between fork and exec. [`Confinement::prepare`] does all of it in the parent; what it yields, a
//! [`Prepared`] ruleset, is one close-on-exec file descriptor, and [`Prepared::enforce`] is a
//! few system calls (the capabilities dropped, `prctl(PR_SET_NO_NEW_PRIVS)`,
//! `landlock_restrict_self`), async-signal-safe, made by the child in `pre_exec` ([`confine`]).
//! The crate's `restrict_self` is not called there: it consumes its ruleset (a command may be
//! spawned more than once) and nothing promises that its code stays free of allocations.
//!
//! Forked kernels (forked from a warm template, later): the same split holds. The rules are data,
//! and the prepared ruleset is a file descriptor ([`Prepared`] is `AsFd`) that the template can
//! inherit or receive (`SCM_RIGHTS`); its forked child makes the same calls, in whatever
//! language, before it runs the user's code. Path rules hold the inodes open at `prepare`, so a
//! user's directories must exist by then; Landlock domains stack by intersection, so a template
//! that is itself confined must allow what every child will need.
//!
//! Not covered by Landlock up to ABI 7 (this module's floor is 6): UDP, connecting to a pathname
//! UNIX socket (ABI 9), reading another process's `/proc/<pid>/cmdline` when `/proc` is readable.
//! A kernel keeps its uid: what the uid owns outside Landlock's reach (UDP, other processes'
//! command lines) is shared by every kernel of one gateway.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

/// The Landlock ABI whose rights and scopes a confinement handles: TCP rules (4) and the signal
/// and abstract UNIX socket scopes (6). A fixed ABI, never the running kernel's newest, so that a
/// newer crate or kernel adds no right that the kernel was not run with.
const ABI_NEEDED: ABI = ABI::V6;

/// What each Landlock ABI up to [`ABI_NEEDED`] brings that a confinement relies on.
const FEATURES: [(i64, &str); 5] = [
    (2, "renaming and linking across directories (refer)"),
    (3, "truncation rights"),
    (4, "TCP connect and bind rules"),
    (5, "device ioctl rights"),
    (6, "signal and abstract UNIX socket scoping"),
];

/// The system paths a kernel reads and executes (those that exist are taken). `/etc` is taken
/// whole: the gateway's configuration and TLS keys must live elsewhere ([`Confinement::exposes`]
/// tells). `/proc` because programs need `/proc/self` (and `/dev/fd` is a link there); another
/// process's entries stay denied (ptrace), but its command line is readable.
const SYSTEM_READ_ONLY: [&str; 11] = [
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/proc",
    "/dev/urandom",
    "/dev/random",
];

/// The devices every program writes to.
const SYSTEM_READ_WRITE: [&str; 3] = ["/dev/null", "/dev/zero", "/dev/full"];

/// What a kernel may do: everything not granted here is denied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    /// Read, write, create, rename and remove beneath each (a file: read and write it). Never a
    /// device node: creating one is denied everywhere.
    pub read_write: Vec<PathBuf>,
    /// Read and execute beneath each.
    pub read_only: Vec<PathBuf>,
    /// The TCP ports the kernel may connect to (any address: Landlock rules are per port).
    pub connect_ports: Vec<u16>,
    /// The TCP ports the kernel may bind: its own listening port.
    pub bind_ports: Vec<u16>,
    /// Binding is not governed at all (the fork server's: each of its children binds a port
    /// of its own, which its own ruleset names).
    pub bind_any: bool,
}

/// Why a command cannot be confined.
#[derive(Debug)]
pub enum Error {
    /// This machine cannot enforce every rule: what it lacks.
    Unsupported(String),
    /// A path to grant cannot be opened: every one must exist when the rules are prepared.
    Path { path: PathBuf, source: io::Error },
    /// Landlock refused the ruleset or a rule.
    Landlock(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unsupported(what) => write!(f, "kernel confinement is not possible: {what}"),
            Error::Path { path, source } => {
                write!(f, "cannot confine to {}: {source}", path.display())
            }
            Error::Landlock(e) => write!(f, "Landlock refused the kernel's rules: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Path { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<landlock::RulesetError> for Error {
    fn from(e: landlock::RulesetError) -> Error {
        Error::Landlock(e.to_string())
    }
}

impl Confinement {
    /// What a kernel run from `program` needs to start, and nothing else: the system paths of
    /// this machine read-only and its devices read-write, and `program`'s own installation (its
    /// venv and the Python prefix the venv was made from; a program outside a venv: itself,
    /// its other files are the caller's to add). No writable directory and no port: the
    /// caller adds the user's.
    pub fn runtime(program: &Path) -> Confinement {
        let (mut read_only, read_write) = system_paths(|p| p.exists());
        let program = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
        let cfg = venv_root(&program)
            .and_then(|root| std::fs::read_to_string(root.join("pyvenv.cfg")).ok());
        for p in runtime_paths(&program, cfg.as_deref()) {
            if !read_only.iter().any(|granted| p.starts_with(granted)) {
                read_only.push(p);
            }
        }
        Confinement {
            read_write,
            read_only,
            connect_ports: Vec::new(),
            bind_ports: Vec::new(),
            bind_any: false,
        }
    }

    /// Whether `path` is beneath (or is) a granted path, read-only or read-write: what the
    /// gateway checks its own state, configuration and keys against. Lexical: give canonical
    /// paths.
    pub fn exposes(&self, path: &Path) -> bool {
        self.read_only
            .iter()
            .chain(&self.read_write)
            .any(|granted| path.starts_with(granted))
    }

    /// Builds the Landlock ruleset, in the parent: the machine is checked, every path opened (a
    /// missing one is an error), every rule added under the hard requirement.
    pub fn prepare(&self) -> Result<Prepared, Error> {
        check_supported().map_err(Error::Unsupported)?;
        self.build()
    }

    fn build(&self) -> Result<Prepared, Error> {
        let mut ruleset = Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(ABI_NEEDED))?
            .handle_access(if self.bind_any {
                BitFlags::from(AccessNet::ConnectTcp)
            } else {
                AccessNet::from_all(ABI_NEEDED)
            })?
            .scope(Scope::from_all(ABI_NEEDED))?
            .create()?;
        for path in &self.read_only {
            ruleset = beneath(ruleset, path, AccessFs::from_read(ABI_NEEDED), true)?;
        }
        let read_write =
            AccessFs::from_all(ABI_NEEDED) & !(AccessFs::MakeChar | AccessFs::MakeBlock);
        for path in &self.read_write {
            ruleset = beneath(ruleset, path, read_write, false)?;
        }
        for &port in &self.connect_ports {
            ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
        }
        for &port in &self.bind_ports {
            ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::BindTcp))?;
        }
        let fd: Option<OwnedFd> = ruleset.into();
        let fd = fd.ok_or_else(|| Error::Unsupported("Landlock made no ruleset".into()))?;
        let filter = super::seccomp::filter().map_err(Error::Unsupported)?;
        Ok(Prepared {
            fd: Arc::new(fd),
            filter: Arc::new(filter),
        })
    }
}

/// Adds the rule granting `access` beneath `path` (of it, a file's rights only for a file).
/// Without `follow`, `path` itself must not be a symlink: a writable place is the user's, who
/// could have put one there to bend the rule elsewhere (system paths may be symlinks, such as
/// `/bin` to `usr/bin`).
fn beneath(
    ruleset: RulesetCreated,
    path: &Path,
    access: BitFlags<AccessFs>,
    follow: bool,
) -> Result<RulesetCreated, Error> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let error = |source| Error::Path {
        path: path.to_path_buf(),
        source,
    };
    // O_PATH: a handle on the inode, whatever its permissions; the rule binds that inode.
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | nofollow)
        .open(path)
        .map_err(error)?;
    let meta = file.metadata().map_err(error)?;
    if meta.is_symlink() {
        return Err(error(io::Error::other("a symlink, not granted")));
    }
    let access = if meta.is_dir() {
        access
    } else {
        access & AccessFs::from_file(ABI_NEEDED)
    };
    Ok(ruleset.add_rule(PathBeneath::new(file, access))?)
}

/// A confinement's ruleset, built in the parent: enforced by a child before it runs anything.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Landlock's ruleset file descriptor (close-on-exec): shared by every spawn of a command.
    fd: Arc<OwnedFd>,
    /// The seccomp filter of what Landlock does not see (`seccomp`), compiled.
    filter: Arc<seccompiler::BpfProgram>,
}

impl Prepared {
    /// Confines the calling thread, and what it executes, for good: every capability dropped,
    /// `no_new_privs`, the ruleset, then the seccomp filter of what Landlock does not see. System calls only, no allocation: safe in a child
    /// between fork and exec (or in a forked kernel). Never call it in the gateway: the thread
    /// would stay confined.
    #[allow(unsafe_code)]
    pub fn enforce(&self) -> io::Result<()> {
        drop_capabilities()?;
        // SAFETY: prctl and landlock_restrict_self take integers only; the descriptor is open for
        // as long as `self` is.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            let flags: libc::c_uint = 0;
            if libc::syscall(libc::SYS_landlock_restrict_self, self.fd.as_raw_fd(), flags) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The filter was compiled in the parent: its program is only pointed at here.
            #[repr(C)]
            struct Fprog {
                len: libc::c_ushort,
                filter: *const seccompiler::sock_filter,
            }
            let prog = Fprog {
                len: self.filter.len() as libc::c_ushort,
                filter: self.filter.as_ptr(),
            };
            let mode = libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong;
            let none: libc::c_ulong = 0;
            if libc::syscall(libc::SYS_seccomp, mode, none, &prog as *const Fprog) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Has `cmd`'s child enforce the ruleset just before it executes (after the command's own
    /// earlier `pre_exec` steps). A child that cannot makes the spawn fail with that error.
    #[allow(unsafe_code)]
    pub fn apply(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt as _;
        let prepared = self.clone();
        // SAFETY: `enforce` makes system calls only and allocates nothing (see there).
        unsafe {
            cmd.pre_exec(move || prepared.enforce());
        }
    }
}

/// Drops every capability of the calling thread: the bounding set (while it holds
/// CAP_SETPCAP), the ambient set, then the effective, permitted and inheritable sets. Landlock
/// alone does not hold a root kernel: with CAP_SYS_ADMIN or CAP_PERFMON it reads another
/// process's `/proc/<pid>/environ`, `maps` and `auxv` past the ptrace check that Landlock denies
/// (seen on Linux 6.18: the kernel's memory-access check lets those capabilities read). With
/// nothing permitted and `no_new_privs`, an exec (as root, or of a setuid or file-capability
/// program) gains nothing back.
#[allow(unsafe_code)]
fn drop_capabilities() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let none = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: prctl takes integers; capset reads the header and two data structs on this stack,
    // alive for the call.
    unsafe {
        // First: dropping from the bounding set needs CAP_SETPCAP, which capset takes away.
        for cap in 0..64 as libc::c_ulong {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                match io::Error::last_os_error().raw_os_error() {
                    // Past this kernel's last capability: all dropped.
                    Some(libc::EINVAL) => break,
                    // No CAP_SETPCAP: a thread that has none permitted (below) and no_new_privs
                    // gains nothing from its bounding set.
                    Some(libc::EPERM) => break,
                    _ => return Err(io::Error::last_os_error()),
                }
            }
        }
        let clear_all = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
        if libc::prctl(libc::PR_CAP_AMBIENT, clear_all, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_capset, &header as *const Header, none.as_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Prepared {
    /// The seccomp filter's program as bytes, each instruction in this machine's layout (what a
    /// forked kernel hands to `seccomp(2)` itself).
    pub fn filter_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(self.filter.len() * 8);
        for i in self.filter.iter() {
            bytes.extend_from_slice(&i.code.to_ne_bytes());
            bytes.push(i.jt);
            bytes.push(i.jf);
            bytes.extend_from_slice(&i.k.to_ne_bytes());
        }
        bytes
    }
}

impl AsFd for Prepared {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Confines what `cmd` starts to `confinement` (a `tokio::process::Command`: its `as_std_mut`):
/// the ruleset is built now, in the parent, and enforced by the child just before it executes.
pub fn confine(cmd: &mut Command, confinement: &Confinement) -> Result<(), Error> {
    confinement.prepare()?.apply(cmd);
    Ok(())
}

/// Whether this machine can enforce every rule of a confinement: `Err` says what it lacks.
pub fn check_supported() -> Result<(), String> {
    verdict(landlock_abi())?;
    // The crate agrees: the whole handled set under the hard requirement.
    Confinement::default()
        .build()
        .map(drop)
        .map_err(|e| e.to_string())
}

/// [`check_supported`] as a machine with Landlock ABI `abi` would answer (`None`: no Landlock
/// at all): what a test of the refusal runs on a machine that has it.
pub fn check_abi(abi: Option<i64>) -> Result<(), String> {
    verdict(abi.ok_or(libc::ENOSYS))
}

/// The running kernel's Landlock ABI, or the errno of the query.
#[allow(unsafe_code)]
fn landlock_abi() -> Result<i64, i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the version query reads no attribute (a null pointer, size 0).
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(v)
    }
}

/// What the answer of the ABI query means for a confinement.
fn verdict(abi: Result<i64, i32>) -> Result<(), String> {
    let abi = match abi {
        Ok(abi) => abi,
        Err(libc::ENOSYS) => {
            return Err(
                "Landlock is not in this Linux kernel (CONFIG_SECURITY_LANDLOCK), or a \
                        seccomp filter (a container's) blocks it"
                    .into(),
            )
        }
        Err(libc::EOPNOTSUPP) => {
            return Err(
                "Landlock is in this Linux kernel but not enabled (add `landlock` to \
                        the `lsm=` boot parameter)"
                    .into(),
            )
        }
        Err(errno) => {
            return Err(format!(
                "the Landlock ABI query failed: {}",
                io::Error::from_raw_os_error(errno)
            ))
        }
    };
    let missing: Vec<&str> = FEATURES
        .iter()
        .filter(|(since, _)| *since > abi)
        .map(|(_, what)| *what)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "Landlock ABI {} or newer is needed; this kernel has ABI {abi}, without {}",
        ABI_NEEDED as i32,
        missing.join(", ")
    ))
}

/// The system paths to grant, of those `exists` finds: read-only, and read-write.
fn system_paths(exists: impl Fn(&Path) -> bool) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let take = |paths: &[&str]| -> Vec<PathBuf> {
        paths
            .iter()
            .map(PathBuf::from)
            .filter(|p| exists(p))
            .collect()
    };
    (take(&SYSTEM_READ_ONLY), take(&SYSTEM_READ_WRITE))
}

/// The root of the venv `program` is in, by its place: `<root>/bin/<program>`.
fn venv_root(program: &Path) -> Option<&Path> {
    program
        .parent()
        .filter(|bin| bin.file_name().is_some_and(|n| n == "bin"))
        .and_then(Path::parent)
}

/// What a kernel run from `program` (canonical) reads and executes besides the system: with the
/// `pyvenv.cfg` text of its venv, the venv and the prefix of the Python it was made from (its
/// `home`, the interpreter's directory, as Python finds it); else the program alone. Never `/`.
fn runtime_paths(program: &Path, pyvenv_cfg: Option<&str>) -> Vec<PathBuf> {
    let (Some(root), Some(cfg)) = (venv_root(program), pyvenv_cfg) else {
        return vec![program.to_path_buf()];
    };
    let home = cfg.lines().find_map(|line| {
        let (key, value) = line.split_once('=')?;
        (key.trim() == "home").then(|| PathBuf::from(value.trim()))
    });
    let prefix = home
        .filter(|h| h.is_absolute())
        .map(|home| match home.parent() {
            Some(parent) if home.file_name().is_some_and(|n| n == "bin") => parent.to_path_buf(),
            _ => home,
        });
    std::iter::once(root.to_path_buf())
        .chain(prefix)
        .filter(|p| p.parent().is_some())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_every_rule_is_refused_with_what_it_lacks() {
        assert_eq!(verdict(Ok(6)), Ok(()));
        assert_eq!(verdict(Ok(7)), Ok(()));
        let old = verdict(Ok(2)).unwrap_err();
        assert!(old.starts_with("Landlock ABI 6 or newer is needed; this kernel has ABI 2"));
        assert!(old.contains("TCP connect and bind rules"), "{old}");
        assert!(
            old.contains("signal and abstract UNIX socket scoping"),
            "{old}"
        );
        assert!(!old.contains("refer"), "{old}");
        let five = verdict(Ok(5)).unwrap_err();
        assert!(
            five.ends_with("without signal and abstract UNIX socket scoping"),
            "{five}"
        );
        assert!(verdict(Err(libc::ENOSYS))
            .unwrap_err()
            .contains("not in this Linux kernel"));
        assert!(verdict(Err(libc::EOPNOTSUPP))
            .unwrap_err()
            .contains("not enabled"));
        assert!(verdict(Err(libc::EPERM))
            .unwrap_err()
            .starts_with("the Landlock ABI query failed"));
    }

    #[test]
    fn the_system_paths_are_those_that_exist() {
        let (ro, rw) = system_paths(|p| p != Path::new("/lib32") && p != Path::new("/dev/full"));
        assert!(ro.contains(&PathBuf::from("/usr")));
        assert!(ro.contains(&PathBuf::from("/etc")));
        assert!(!ro.contains(&PathBuf::from("/lib32")));
        assert_eq!(rw, [PathBuf::from("/dev/null"), PathBuf::from("/dev/zero")]);
        // Nothing of a user's, the gateway's or the temporary directory, ever.
        for p in ro.iter().chain(&rw) {
            for never in [
                "/", "/root", "/home", "/tmp", "/var", "/run", "/srv", "/dev",
            ] {
                assert_ne!(p, Path::new(never));
            }
        }
    }

    #[test]
    fn a_venv_kernel_reads_its_venv_and_the_python_it_was_made_from() {
        let program = Path::new("/root/.cache/k/venv/bin/iac-code");
        let cfg = "home = /root/.pyenv/versions/3.11.7/bin\ninclude-system-site-packages = false\n\
                   version = 3.11.7\n";
        assert_eq!(
            runtime_paths(program, Some(cfg)),
            [
                PathBuf::from("/root/.cache/k/venv"),
                PathBuf::from("/root/.pyenv/versions/3.11.7")
            ]
        );
        // A system Python: /usr, which the system paths hold already.
        assert_eq!(
            runtime_paths(program, Some("home=/usr/bin")),
            [PathBuf::from("/root/.cache/k/venv"), PathBuf::from("/usr")]
        );
        // Never the whole file system, nor a relative home.
        assert_eq!(
            runtime_paths(program, Some("home = /bin")),
            [PathBuf::from("/root/.cache/k/venv")]
        );
        assert_eq!(
            runtime_paths(program, Some("home = py/bin")),
            [PathBuf::from("/root/.cache/k/venv")]
        );
        // No venv: the program alone, never its directory (which may be a home's).
        assert_eq!(
            runtime_paths(Path::new("/root/bin/iac-code"), None),
            [PathBuf::from("/root/bin/iac-code")]
        );
        assert_eq!(
            runtime_paths(Path::new("/opt/k/iac-code"), Some("home = /usr/bin")),
            [PathBuf::from("/opt/k/iac-code")]
        );
    }

    #[test]
    fn the_runtime_of_a_system_program_is_the_system() {
        let c = Confinement::runtime(Path::new("/bin/sh"));
        assert!(c.read_only.contains(&PathBuf::from("/usr")));
        assert!(c.read_write.contains(&PathBuf::from("/dev/null")));
        // /bin/sh is beneath /usr (or /bin): nothing more.
        assert!(c
            .read_only
            .iter()
            .all(|p| SYSTEM_READ_ONLY.contains(&p.to_str().unwrap())));
        assert!(c.connect_ports.is_empty() && c.bind_ports.is_empty());
    }

    /// A writable place given as a symlink is refused (its user could have put it there to
    /// bend the rule); a read-only one may be one (`/bin` → `usr/bin`).
    #[test]
    fn a_writable_path_that_is_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let writable = |p: &Path| Confinement {
            read_write: vec![p.to_path_buf()],
            ..Confinement::default()
        };
        assert!(writable(&real).build().is_ok());
        let e = writable(&link).build().expect_err("refused");
        assert!(e.to_string().contains("a symlink, not granted"), "{e}");
        let readable = Confinement {
            read_only: vec![link.clone()],
            ..Confinement::default()
        };
        assert!(readable.build().is_ok());
    }

    #[test]
    fn what_a_confinement_exposes_is_what_is_beneath_its_paths() {
        let c = Confinement {
            read_write: vec!["/srv/ws/alice".into()],
            read_only: vec!["/usr".into(), "/etc".into()],
            ..Confinement::default()
        };
        assert!(c.exposes(Path::new("/srv/ws/alice/notes.md")));
        assert!(c.exposes(Path::new("/etc/iac-code-agui/tls/key.pem")));
        assert!(!c.exposes(Path::new("/srv/ws/alicex/notes.md")));
        assert!(!c.exposes(Path::new("/srv/ws/bob")));
        assert!(!c.exposes(Path::new("/srv/ws")));
        assert!(!c.exposes(Path::new("/var/lib/iac-code-agui/state")));
    }
}
