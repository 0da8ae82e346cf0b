//! A user's own kernel (isolation `user`): its directories, its environment, its uid and its
//! confinement, made from the gateway's one kernel launch.
//!
//! Each tenant (see [`crate::tenant::user_key`]) has, each created 0700 on first use and owned by
//! the kernels' uid:
//! - `<kernels>/<key>/home`: HOME, and beneath it `.iac-code`, iac-code's configuration
//!   directory (`IAC_CODE_CONFIG_DIR`: settings, `AGENTS.md`, tasks and contexts);
//! - `<kernels>/<key>/tmp`: TMPDIR;
//! - `<persistence>/<key>` instead of `.iac-code` with `--kernel-persistence-dir`, and
//!   `<backup>/<key>` with `--kernel-backup-dir` (shared by several instances);
//! - `<root>/<key>` under each workspace root: the only workspaces its kernel is allowed.
//!
//! The kernel may read and write those and nothing else; read the system and its installation;
//! connect to the listed TCP ports; bind its own.

use std::path::{Path, PathBuf};

use super::confine::Confinement;
use super::launch::Launch;
use super::supervisor::ChildSpec;
use super::zygote::{ForkServer, ServerSpec};

/// How every user's kernel is made.
#[derive(Debug, Clone)]
pub struct Isolation {
    /// The launch every kernel starts from (program, inherited environment), the readiness
    /// timeout and the client's timeouts.
    pub base: ChildSpec,
    /// Where each tenant's HOME and TMPDIR are made.
    pub kernels_root: PathBuf,
    /// The workspace roots: a tenant's workspaces are under `<root>/<key>` of each.
    pub workspace_roots: Vec<PathBuf>,
    /// `--kernel-persistence-dir`: a tenant's iac-code configuration directory is `<it>/<key>`.
    pub persistence_root: Option<PathBuf>,
    /// `--kernel-backup-dir`: a tenant's session backups are under `<it>/<key>`.
    pub backup_root: Option<PathBuf>,
    /// The uid and gid kernels run as; `None`: the gateway's.
    pub identity: Option<(u32, u32)>,
    /// What every kernel may read and execute, and the ports it may connect to.
    pub runtime: Confinement,
    /// Kernels are forked by this fork server when it is ready (`--kernel-start fork`).
    pub fork: Option<ForkServer>,
    /// Variables of a user's own, by their key, set last (the LLM egress's capability).
    pub user_env: Option<UserEnv>,
}

/// Variables each user's kernel gets of its own, by the user's key.
#[derive(Clone)]
pub struct UserEnv(pub std::sync::Arc<VarsOf>);

/// The variables of a user's key.
pub type VarsOf = dyn Fn(&str) -> Vec<(String, String)> + Send + Sync;

impl std::fmt::Debug for UserEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UserEnv(..)")
    }
}

/// A tenant's kernel, ready to start.
#[derive(Debug)]
pub struct TenantSpec {
    pub spec: ChildSpec,
    /// The tenant had a kernel before (its configuration directory exists): this one restores
    /// its sessions.
    pub restored: bool,
}

impl Isolation {
    /// The directories of `key`'s kernel, as they are named (see the module).
    fn config_dir(&self, key: &str) -> PathBuf {
        match &self.persistence_root {
            Some(root) => root.join(key),
            None => self.kernels_root.join(key).join("home/.iac-code"),
        }
    }

    /// The workspace roots of tenant `key`.
    pub fn workspaces_of(&self, key: &str) -> Vec<PathBuf> {
        self.workspace_roots.iter().map(|r| r.join(key)).collect()
    }

    /// The kernel of tenant `key`: its directories made, its environment and confinement set.
    /// Blocking I/O.
    ///
    /// Everything beneath a granted directory is the user's kernel's to change, a symlink put in
    /// place of a directory included: so every directory is made from a root the kernel cannot
    /// change (the kernels', workspace, backup and persistence roots), a component at a time,
    /// never through a symlink; and only those roots' children are granted (iac-code's
    /// configuration directory lies within the kernel's own and needs no rule of its own, which
    /// a symlink swapped in for it would bend).
    pub fn spec_for(&self, key: &str) -> Result<TenantSpec, String> {
        let own = self.kernels_root.join(key);
        let home = own.join("home");
        let tmp = own.join("tmp");
        let config = self.config_dir(key);
        let restored = config.is_dir();
        let backup = self.backup_root.as_ref().map(|b| b.join(key));
        let workspaces = self.workspaces_of(key);
        let mut made: Vec<(&Path, PathBuf)> = vec![
            (&self.kernels_root, PathBuf::from(key)),
            (&self.kernels_root, Path::new(key).join("home")),
            (&self.kernels_root, Path::new(key).join("tmp")),
        ];
        let mut writable = vec![own.clone()];
        match &self.persistence_root {
            Some(root) => {
                made.push((root, PathBuf::from(key)));
                writable.push(config.clone());
            }
            None => made.push((&self.kernels_root, Path::new(key).join("home/.iac-code"))),
        }
        for root in self.backup_root.iter().chain(&self.workspace_roots) {
            made.push((root, PathBuf::from(key)));
            writable.push(root.join(key));
        }
        for (root, rest) in &made {
            // The roots are the operator's (made at start-up, entered by the kernels' uid).
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(root)
                .map_err(|e| format!("cannot make {}: {e}", root.display()))?;
            make_beneath(root, rest, self.identity, true)
                .map_err(|e| format!("cannot make {}: {e}", root.join(rest).display()))?;
        }
        let mut launch: Launch = self.base.launch.clone();
        launch.remove(not_for_a_user);
        launch
            .env("HOME", home.display().to_string())
            .env("TMPDIR", tmp.display().to_string())
            .env("IAC_CODE_CONFIG_DIR", config.display().to_string())
            .env("IACCODE_A2A_ALLOWED_CWDS", join_paths(&workspaces));
        if let Some(b) = &backup {
            launch.backup_dir(b);
        }
        if let Some(own) = &self.user_env {
            let vars = (own.0)(key);
            launch.remove(|k| vars.iter().any(|(n, _)| n == k));
            launch.envs(vars);
        }
        if let Some((uid, gid)) = self.identity {
            launch.run_as(uid, gid);
        }
        if let Some(server) = &self.fork {
            launch.fork_from(server.clone());
        }
        let mut confinement = self.runtime.clone();
        confinement.read_write.extend(writable);
        launch.confine(confinement);
        Ok(TenantSpec {
            spec: ChildSpec {
                launch,
                ready_timeout: self.base.ready_timeout,
                timeouts: self.base.timeouts,
            },
            restored,
        })
    }
}

impl Isolation {
    /// The roots every user's directories are made beneath: the kernels', persistence, backup
    /// and workspace roots.
    fn roots(&self) -> Vec<&PathBuf> {
        std::iter::once(&self.kernels_root)
            .chain(&self.persistence_root)
            .chain(&self.backup_root)
            .chain(&self.workspace_roots)
            .collect()
    }

    /// How the fork server of these kernels runs (`python`: their interpreter; `extra`: more of
    /// its environment): as the kernels' uid, confined to the union of what its children may
    /// reach (every root, made now if missing, read-write; what every kernel reads), with the
    /// kernels' shared environment and nothing of a user's ([`zygote_env`]).
    pub fn fork_server_spec(
        &self,
        python: PathBuf,
        extra: &[(String, String)],
    ) -> Result<ServerSpec, String> {
        use std::os::unix::fs::DirBuilderExt as _;
        let mut confinement = self.runtime.clone();
        for root in self.roots() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(root)
                .map_err(|e| format!("cannot make {}: {e}", root.display()))?;
            confinement.read_write.push(root.clone());
        }
        let mut env = zygote_env(self.base.launch.vars());
        env.extend(extra.iter().cloned());
        Ok(ServerSpec {
            python,
            env,
            identity: self.identity,
            confinement,
        })
    }
}

/// The fork server's environment, from the kernels' shared one: only what is every kernel's
/// alike and may shape what a module computes at import (search path, locale, time zone,
/// certificates, logging and telemetry settings), never a credential; HOME a directory that is
/// nobody's. Each forked kernel takes its whole environment from its request.
pub fn zygote_env(base: &[(String, String)]) -> Vec<(String, String)> {
    const NAMES: [&str; 12] = [
        "PATH",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TZDIR",
        "PYTHONPATH",
        "PYTHONWARNINGS",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
    ];
    let secret = [
        "KEY",
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "HEADERS",
        "CREDENTIAL",
        "AUTH",
    ];
    let mut env: Vec<(String, String)> = base
        .iter()
        .filter(|(k, _)| {
            let kept = NAMES.contains(&k.as_str())
                || k.starts_with("LC_")
                || k.starts_with("OTEL_")
                || k.starts_with("LOGURU_");
            kept && !secret.iter().any(|s| k.to_ascii_uppercase().contains(s))
        })
        .cloned()
        .collect();
    env.push(("HOME".into(), "/nonexistent".into()));
    env
}

/// Makes a user's own root `dir` (the operator's directory above it must exist) 0700, owned by
/// `identity` when given, as every user directory is made ([`make_beneath`]).
pub fn private_dir(dir: &Path, identity: Option<(u32, u32)>) -> std::io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(std::io::Error::other("not a directory beneath another"));
    };
    make_beneath(parent, Path::new(name), identity, true)
}

/// Makes the workspace `path` beneath the one of a user's `roots` it is in, a directory at a
/// time, never through a symlink: the user's kernel may change what is beneath their root while
/// the gateway works there, and a symlink swapped in after the workspace was checked must not
/// send the gateway's `mkdir` (as root, perhaps) elsewhere. Each directory made is 0700 and
/// given to `identity`, the kernels' uid, when named. Blocking I/O.
pub fn make_workspace(
    path: &Path,
    roots: &[PathBuf],
    identity: Option<(u32, u32)>,
) -> std::io::Result<()> {
    // `path` is canonical (a checked workspace): so are the roots it is compared with (an
    // operator's root may be named through a symlink; a user's own root is the gateway's).
    let roots: Vec<PathBuf> = roots
        .iter()
        .map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()))
        .collect();
    let Some(root) = roots.iter().find(|r| path.starts_with(r)) else {
        return Err(std::io::Error::other("not beneath the user's roots"));
    };
    let rest = path.strip_prefix(root).map_err(std::io::Error::other)?;
    make_beneath(root, rest, identity, false)
}

/// Makes `root/rest` a component at a time from `root`, never through a symlink (a symlink on
/// the way fails it): directories made are 0700 and given to `identity` when named; with
/// `settle`, existing ones too (a kernel's own directories are its user's alone).
pub fn make_beneath(
    root: &Path,
    rest: &Path,
    identity: Option<(u32, u32)>,
    settle: bool,
) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;
    // Not O_PATH: fchmod and fchown need a descriptor of the directory itself.
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let c = |b: &[u8]| CString::new(b).map_err(std::io::Error::other);
    let open_at = |dir: libc::c_int, name: &CString| -> std::io::Result<OwnedFd> {
        // SAFETY: a NUL-terminated name; the result is checked and owned at once.
        #[allow(unsafe_code)]
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        #[allow(unsafe_code)]
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let mut dir = open_at(libc::AT_FDCWD, &c(root.as_os_str().as_bytes())?)?;
    for part in rest.components() {
        let std::path::Component::Normal(name) = part else {
            return Err(std::io::Error::other("not a plain path"));
        };
        let name = c(name.as_bytes())?;
        // SAFETY: integers and a NUL-terminated name.
        #[allow(unsafe_code)]
        let made = unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), 0o700) } == 0;
        if !made && std::io::Error::last_os_error().kind() != std::io::ErrorKind::AlreadyExists {
            return Err(std::io::Error::last_os_error());
        }
        // O_NOFOLLOW: a symlink here (planted, or swapped in) fails the walk.
        let next = open_at(dir.as_raw_fd(), &name)?;
        if made || settle {
            let fd = next.as_raw_fd();
            // SAFETY: an open descriptor and integers.
            #[allow(unsafe_code)]
            let r = unsafe {
                match identity {
                    Some((uid, gid)) if libc::fchown(fd, uid, gid) != 0 => -1,
                    _ => libc::fchmod(fd, 0o700),
                }
            };
            if r != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        dir = next;
    }
    Ok(())
}

/// What of the gateway's environment a user's kernel does not get: places shared by every
/// kernel (the XDG directories, the runtime directory of the uid's own services, a shared
/// tokenizer cache; each user's kernel has HOME and TMPDIR of its own), and credentials of the
/// kernel's A2A server other than its token (an API key or a password every kernel would
/// accept: one user's agent could drive another's kernel with it).
fn not_for_a_user(name: &str) -> bool {
    const SHARED: [&str; 6] = [
        "XDG_CONFIG_HOME",
        "XDG_CACHE_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_RUNTIME_DIR",
        "TIKTOKEN_CACHE_DIR",
    ];
    let credential = ["KEY", "PASSWORD", "SECRET", "TOKEN", "USERNAME"];
    SHARED.contains(&name)
        || name
            .strip_prefix("IACCODE_A2A_")
            .is_some_and(|rest| credential.iter().any(|c| rest.contains(c)))
}

/// A colon-separated list of paths (the kernel's `IACCODE_A2A_ALLOWED_CWDS`).
fn join_paths(paths: &[PathBuf]) -> String {
    let each: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    each.join(":")
}

/// The first of `path` and its ancestors that `uid`/`gid` may not search (enter), if any: a
/// kernel running as them could not reach `path`. Modes only (ACLs are not read); root searches
/// everything.
pub fn unreachable_by(path: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt as _;
    if uid == 0 {
        return None;
    }
    let mut at = Some(path);
    let mut blocked = None;
    while let Some(p) = at {
        if let Ok(m) = std::fs::metadata(p) {
            let bit = if m.uid() == uid {
                0o100
            } else if m.gid() == gid {
                0o010
            } else {
                0o001
            };
            if m.mode() & bit == 0 {
                blocked = Some(p.to_path_buf());
            }
        }
        at = p.parent();
    }
    blocked
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn isolation(root: &Path) -> Isolation {
        let mut launch = Launch::new("/opt/venv/bin/iac-code");
        launch.env("PATH", "/usr/bin:/bin");
        Isolation {
            base: ChildSpec {
                launch,
                ready_timeout: std::time::Duration::from_secs(20),
                timeouts: a2a::Timeouts::default(),
            },
            kernels_root: root.join("kernels"),
            workspace_roots: vec![root.join("ws1"), root.join("ws2")],
            persistence_root: None,
            backup_root: Some(root.join("backup")),
            identity: None,
            runtime: Confinement {
                read_only: vec![PathBuf::from("/usr")],
                connect_ports: vec![443],
                ..Confinement::default()
            },
            fork: None,
            user_env: None,
        }
    }

    #[test]
    fn a_tenants_kernel_has_its_own_private_directories_and_nothing_else_writable() {
        let dir = tempfile::tempdir().unwrap();
        let iso = isolation(dir.path());
        let t = iso.spec_for("ualice").unwrap();
        assert!(!t.restored);
        let own = dir.path().join("kernels/ualice");
        for d in [
            own.clone(),
            own.join("home"),
            own.join("home/.iac-code"),
            own.join("tmp"),
            dir.path().join("backup/ualice"),
            dir.path().join("ws1/ualice"),
            dir.path().join("ws2/ualice"),
        ] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        let cmd = t.spec.launch.spawnable(4711, "tok");
        // Confinement is prepared at spawn: this machine has Landlock (the isolation tier
        // requires it).
        let cmd = cmd.unwrap();
        let env: Vec<(String, String)> = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.into(), v?.to_str()?.into())))
            .collect();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("HOME"), Some(own.join("home").display().to_string()));
        assert_eq!(get("TMPDIR"), Some(own.join("tmp").display().to_string()));
        assert_eq!(
            get("IAC_CODE_CONFIG_DIR"),
            Some(own.join("home/.iac-code").display().to_string())
        );
        assert_eq!(
            get("IACCODE_A2A_ALLOWED_CWDS"),
            Some(format!(
                "{}:{}",
                dir.path().join("ws1/ualice").display(),
                dir.path().join("ws2/ualice").display()
            ))
        );
        assert_eq!(
            get("IAC_CODE_CONFIG_BACKUP_DIR"),
            Some(dir.path().join("backup/ualice").display().to_string())
        );
        // Variables of the user's own come last, in place of the launch's.
        let mut iso = isolation(dir.path());
        iso.base.launch.env("IAC_CODE_API_KEY", "shared-key");
        iso.user_env = Some(UserEnv(std::sync::Arc::new(|key: &str| {
            vec![("IAC_CODE_API_KEY".to_owned(), format!("cap-of-{key}"))]
        })));
        let t = iso.spec_for("ualice").unwrap();
        let keys: Vec<&str> = (t.spec.launch.vars().iter())
            .filter(|(k, _)| k == "IAC_CODE_API_KEY")
            .map(|(_, v)| v.as_str())
            .collect();
        assert_eq!(keys, ["cap-of-ualice"]);
        // A second start of the same tenant restores; another tenant's directories are apart.
        assert!(iso.spec_for("ualice").unwrap().restored);
        assert!(!iso.spec_for("ubob").unwrap().restored);
        assert!(!t.spec.launch.avoids(4711));
        assert!(t.spec.launch.avoids(443));
    }

    #[test]
    fn a_users_kernel_gets_no_shared_place_and_no_server_credential() {
        let dir = tempfile::tempdir().unwrap();
        let mut iso = isolation(dir.path());
        iso.base.launch.envs([
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ("XDG_CONFIG_HOME", "/home/op/.config"),
            ("IACCODE_A2A_API_KEY", "shared-key"),
            ("IACCODE_A2A_BASIC_PASSWORD", "pw"),
            ("IACCODE_A2A_BASIC_USERNAME", "op"),
            ("IACCODE_A2A_MAX_TASKS", "4"),
            ("IAC_CODE_MODEL", "m"),
        ]);
        let t = iso.spec_for("ualice").unwrap();
        let cmd = t.spec.launch.command(1, "tok");
        let names: Vec<String> = cmd
            .get_envs()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        for gone in [
            "XDG_RUNTIME_DIR",
            "XDG_CONFIG_HOME",
            "IACCODE_A2A_API_KEY",
            "IACCODE_A2A_BASIC_PASSWORD",
            "IACCODE_A2A_BASIC_USERNAME",
        ] {
            assert!(!names.iter().any(|n| n == gone), "{gone} passed");
        }
        for kept in [
            "IACCODE_A2A_MAX_TASKS",
            "IAC_CODE_MODEL",
            "IACCODE_A2A_HTTP_TOKEN",
        ] {
            assert!(names.iter().any(|n| n == kept), "{kept} missing");
        }
    }

    #[test]
    fn a_persistence_root_holds_each_tenants_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let mut iso = isolation(dir.path());
        iso.persistence_root = Some(dir.path().join("persist"));
        let t = iso.spec_for("ubob").unwrap();
        let env: Vec<_> = t
            .spec
            .launch
            .command(1, "t")
            .get_envs()
            .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
            .collect();
        let want = dir.path().join("persist/ubob");
        assert!(env.contains(&(
            "IAC_CODE_CONFIG_DIR".into(),
            Some(want.clone().into_os_string())
        )));
        assert!(want.is_dir());
    }

    #[test]
    fn a_workspace_is_made_beneath_its_root_and_never_through_a_symlink() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws/ukey");
        std::fs::create_dir_all(&root).unwrap();
        let roots = vec![root.clone()];
        let me = (
            std::fs::metadata(dir.path()).unwrap().uid(),
            std::fs::metadata(dir.path()).unwrap().gid(),
        );
        make_workspace(&root.join("a/b/c"), &roots, Some(me)).unwrap();
        let mode = std::fs::metadata(root.join("a/b/c"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Made again: nothing to do.
        make_workspace(&root.join("a/b/c"), &roots, None).unwrap();
        // A symlink anywhere on the way (the user's kernel may plant one) stops the walk, and
        // nothing is made where it leads.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join("a/link")).unwrap();
        assert!(make_workspace(&root.join("a/link/x"), &roots, None).is_err());
        assert!(!elsewhere.join("x").exists());
        std::os::unix::fs::symlink(&elsewhere, root.join("top")).unwrap();
        assert!(make_workspace(&root.join("top"), &roots, None).is_err());
        // A root named through a symlink (an operator's): the canonical workspace is found.
        let named = dir.path().join("named");
        std::os::unix::fs::symlink(dir.path().join("ws"), &named).unwrap();
        let canonical = std::fs::canonicalize(&root).unwrap().join("d");
        make_workspace(&canonical, &[named.join("ukey")], None).unwrap();
        assert!(root.join("d").is_dir());
        // Outside the roots, or with `..`: refused.
        assert!(make_workspace(&dir.path().join("ws/other"), &roots, None).is_err());
        assert!(make_workspace(&root.join("a/../../x"), &roots, None).is_err());
        assert!(!dir.path().join("ws/x").exists());
    }

    #[test]
    fn a_directory_its_uid_cannot_enter_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(dir.path(), 0o711);
        set(&dir.path().join("a"), 0o700);
        set(&inner, 0o755);
        // Somebody else: the middle one stops them.
        assert_eq!(
            unreachable_by(&inner, 4242, 4242),
            Some(dir.path().join("a"))
        );
        set(&dir.path().join("a"), 0o711);
        assert_eq!(unreachable_by(&inner, 4242, 4242), None);
        assert_eq!(unreachable_by(&inner, 0, 0), None);
    }

    /// The fork server gets what every kernel has alike and may shape an import, never a
    /// credential nor a user's directory: HOME is nobody's.
    #[test]
    fn the_fork_servers_environment_is_the_kernels_shared_one_without_secrets() {
        let base: Vec<(String, String)> = [
            ("PATH", "/usr/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C.UTF-8"),
            ("TZ", "UTC"),
            ("OTEL_SERVICE_NAME", "k"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=secret-1"),
            ("LOGURU_LEVEL", "INFO"),
            ("HOME", "/srv/users/alice"),
            ("TMPDIR", "/srv/users/alice/tmp"),
            ("IAC_CODE_API_KEY", "secret-2"),
            ("IAC_CODE_LLM_HEADERS", "x=secret-3"),
            ("ALIBABA_CLOUD_ACCESS_KEY_SECRET", "secret-4"),
            ("IACCODE_A2A_HTTP_TOKEN", "secret-5"),
            ("HTTPS_PROXY", "http://u:secret-6@proxy:3128"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let env = zygote_env(&base);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "LANG",
                "LC_ALL",
                "TZ",
                "OTEL_SERVICE_NAME",
                "LOGURU_LEVEL",
                "HOME"
            ]
        );
        assert_eq!(env.last().unwrap().1, "/nonexistent");
        let text = format!("{env:?}");
        assert!(
            !text.contains("secret") && !text.contains("alice"),
            "{text}"
        );
    }

    #[test]
    fn the_fork_server_may_reach_every_users_roots_and_runs_as_the_kernels() {
        let dir = tempfile::tempdir().unwrap();
        let mut iso = isolation(dir.path());
        iso.identity = Some((4242, 4243));
        let spec = iso
            .fork_server_spec(
                PathBuf::from("/venv/bin/python3"),
                &[("X".into(), "1".into())],
            )
            .unwrap();
        for root in ["kernels", "ws1", "ws2", "backup"] {
            let root = dir.path().join(root);
            assert!(root.is_dir(), "{}", root.display());
            assert!(spec.confinement.read_write.contains(&root), "{root:?}");
        }
        assert_eq!(spec.confinement.connect_ports, vec![443]);
        assert_eq!(spec.identity, Some((4242, 4243)));
        assert_eq!(spec.env.last(), Some(&("X".to_owned(), "1".to_owned())));
    }
}
