//! Workspace (`cwd`) resolution with allowed roots and symlink-escape prevention; each refusal
//! has its own message.

use std::path::{Path, PathBuf};

use crate::error::{msg, ApiError, Code};
use crate::paths;

fn err(m: &'static str) -> ApiError {
    ApiError::new(Code::InvalidInput, m)
}

/// Where clients' workspaces may be: the configured roots (`--allowed-cwds`, each with `~`
/// expanded), or the private default, `<state-dir>/workspaces` (never the process's directory or
/// the shared temporary one, the reference's defaults: the first is often a checkout, the second
/// anyone's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Roots {
    Configured(Vec<PathBuf>),
    Default(PathBuf),
}

impl Roots {
    /// The roots of `--allowed-cwds` (colon-separated, `~` expanded against `home`, relative ones
    /// dropped), or the default root when it is not given.
    pub fn new(allowed: Option<&str>, home: Option<&str>, default: PathBuf) -> Roots {
        match allowed {
            Some(list) => Roots::Configured(
                list.split(':')
                    .filter(|s| !s.is_empty())
                    .map(|s| PathBuf::from(paths::expand_user(s, home)))
                    .filter(|p| p.is_absolute())
                    .collect(),
            ),
            None => Roots::Default(default),
        }
    }
}

/// The allowed roots that currently exist as directories.
pub fn allowed_roots(roots: &Roots) -> Vec<PathBuf> {
    let candidates = match roots {
        Roots::Configured(list) => list.clone(),
        Roots::Default(root) => vec![root.clone()],
    };
    candidates
        .into_iter()
        .filter_map(|p| paths::resolve(&p).ok())
        .filter(|p| p.is_dir())
        .collect()
}

/// Creates the default workspace root when no root is configured: 0700, as are the missing
/// directories above it (an existing one keeps its mode). The root it stands for, `None` when
/// roots are configured. Called at start-up. Blocking I/O.
pub fn ensure_default_root(roots: &Roots) -> std::io::Result<Option<PathBuf>> {
    use std::os::unix::fs::DirBuilderExt;
    let Roots::Default(root) = roots else {
        return Ok(None);
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(root)?;
    Ok(Some(root.clone()))
}

/// A workspace that passed every check; it may not exist yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    pub path: PathBuf,
    /// It does not exist yet: it is created once the request would be admitted.
    pub missing: bool,
}

/// Creates a checked workspace `path` and its missing parents (with the process's umask, as the
/// reference does). Blocking I/O.
pub fn create(path: &Path) -> Result<(), ApiError> {
    std::fs::create_dir_all(path).map_err(|_| err(msg::CWD_CANNOT_CREATE))
}

/// Whether a client's workspace asks for an expansion: `~` (a home directory) at its start, or
/// `$` (a variable) anywhere. The gateway expands neither in request data: the values would come
/// from its own environment, and the binding (`GET /threads/{threadId}`) and the directory's name
/// would show them to the client (a secret in `$IAC_CODE_API_KEY`, a password in the state URL).
/// Operator configuration (`--state-dir`, the allowed roots) keeps its expansion.
pub fn asks_for_expansion(raw: &str) -> bool {
    raw.starts_with('~') || raw.contains('$')
}

/// Resolves and checks a client's `raw` workspace without changing anything: written out in
/// full (nothing is expanded), absolute, under an allowed root after symlinks. Blocking I/O:
/// call it off the async runtime.
pub fn resolve(raw: &str, roots: &Roots) -> Result<Workspace, ApiError> {
    if asks_for_expansion(raw) {
        return Err(err(msg::CWD_NOT_EXPANDED));
    }
    if raw.is_empty() || !Path::new(raw).is_absolute() {
        return Err(err(msg::CWD_NOT_ABSOLUTE));
    }
    let logical = paths::normalize(Path::new(raw));
    let resolved = paths::resolve(&logical).map_err(|_| err(msg::CWD_INVALID))?;
    let roots = allowed_roots(roots);
    if !roots.iter().any(|r| resolved.starts_with(r)) {
        return Err(err(msg::CWD_OUTSIDE_ROOTS));
    }
    let missing = match std::fs::metadata(&resolved) {
        Ok(m) if m.is_dir() => false,
        Ok(_) => return Err(err(msg::CWD_NOT_DIR)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            true
        }
        Err(_) => return Err(err(msg::CWD_INVALID)),
    };
    Ok(Workspace {
        path: resolved,
        missing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without configured roots the one root is `<state-dir>/workspaces`, private; the process's
    /// directory and the temporary directory are not roots.
    #[test]
    fn the_default_root_is_a_private_directory_of_the_state_dir() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = paths::resolve(dir.path()).unwrap();
        let c = Roots::new(None, None, root.join("state/workspaces"));
        assert!(allowed_roots(&c).is_empty(), "not created yet");
        let made = ensure_default_root(&c).unwrap().unwrap();
        assert_eq!(made, root.join("state/workspaces"));
        for d in [root.join("state"), made.clone()] {
            let mode = std::fs::metadata(&d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", d.display());
        }
        assert_eq!(allowed_roots(&c), vec![made.clone()]);
        let ok = made.join("t1");
        assert_eq!(resolve(ok.to_str().unwrap(), &c).unwrap().path, ok);
        let here = paths::resolve(&std::env::current_dir().unwrap()).unwrap();
        for outside in [here.join("w"), std::env::temp_dir().join("w")] {
            assert_eq!(
                resolve(outside.to_str().unwrap(), &c).unwrap_err().message,
                msg::CWD_OUTSIDE_ROOTS,
                "{}",
                outside.display()
            );
        }
        // Configured roots: nothing is created.
        let elsewhere = root.join("elsewhere").display().to_string();
        let configured = Roots::new(Some(&elsewhere), None, made.clone());
        assert_eq!(ensure_default_root(&configured).unwrap(), None);
        assert!(!root.join("elsewhere").exists());
    }

    fn cfg(root: &Path) -> Roots {
        let r = root.to_str().unwrap().to_owned();
        let allowed = format!("{r}/ws:/nonexistent-root");
        Roots::new(
            Some(&allowed),
            Some("/home/u"),
            root.join("state/workspaces"),
        )
    }

    #[test]
    fn resolution_rules() {
        let dir = tempfile::tempdir().unwrap();
        let root = paths::resolve(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("ws/a")).unwrap();
        std::fs::write(root.join("ws/file"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("ws/escape")).unwrap();
        std::os::unix::fs::symlink(root.join("ws/a"), root.join("ws/alias")).unwrap();
        let c = cfg(&root);
        let ws = root.join("ws");
        let r = |s: &str| {
            let w = resolve(s, &c)?;
            create(&w.path)?;
            Ok::<_, ApiError>(w.path)
        };
        assert_eq!(r(ws.join("a").to_str().unwrap()).unwrap(), ws.join("a"));
        assert_eq!(
            r(&format!("{}/a/../a/", ws.display())).unwrap(),
            ws.join("a")
        );
        assert_eq!(r(ws.join("alias").to_str().unwrap()).unwrap(), ws.join("a"));
        // Nothing of the gateway's environment is expanded into request data.
        for asks in [
            "$W/a",
            "~/a",
            "~",
            "~u/a",
            &format!("{}/${{HOME}}", ws.display()),
        ] {
            assert_eq!(
                r(asks).unwrap_err().message,
                msg::CWD_NOT_EXPANDED,
                "{asks}"
            );
        }
        assert!(!root.join("ws/${HOME}").exists());
        assert_eq!(r("relative/x").unwrap_err().message, msg::CWD_NOT_ABSOLUTE);
        assert_eq!(r("").unwrap_err().message, msg::CWD_NOT_ABSOLUTE);
        assert_eq!(r("/etc").unwrap_err().message, msg::CWD_OUTSIDE_ROOTS);
        assert_eq!(
            r(ws.join("escape").to_str().unwrap()).unwrap_err().message,
            msg::CWD_OUTSIDE_ROOTS
        );
        assert_eq!(
            r(ws.join("file").to_str().unwrap()).unwrap_err().message,
            msg::CWD_NOT_DIR
        );
        let deep = ws.join("new/deep/dir");
        let checked = resolve(deep.to_str().unwrap(), &c).unwrap();
        assert!(
            !deep.exists() && checked.missing,
            "checking creates nothing"
        );
        create(&checked.path).unwrap();
        assert!(deep.is_dir());
        create(&ws.join("a")).unwrap();
        assert_eq!(
            r(ws.join("file/sub").to_str().unwrap())
                .unwrap_err()
                .message,
            msg::CWD_CANNOT_CREATE
        );
    }
}
