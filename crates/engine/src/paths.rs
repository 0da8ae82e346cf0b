//! Path helpers shared by configuration and workspace resolution: `~` and `$VAR` expansion,
//! lexical normalisation, and non-strict symlink resolution (like Python's `os.path.realpath`).

use std::io;
use std::path::{Component, Path, PathBuf};

/// Expands a leading `~` or `~/` with `home`.
pub fn expand_user(s: &str, home: Option<&str>) -> String {
    match home {
        Some(h) if s == "~" => h.to_owned(),
        Some(h) if s.starts_with("~/") => format!("{}{}", h.trim_end_matches('/'), &s[1..]),
        _ => s.to_owned(),
    }
}

/// Expands `$VAR` and `${VAR}`; unknown variables are left untouched (Python's `expandvars`).
pub fn expand_vars(s: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'$' {
            let next = s[i..].find('$').map(|p| i + p).unwrap_or(b.len());
            out.push_str(&s[i..next]);
            i = next;
            continue;
        }
        let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        if b.get(i + 1) == Some(&b'{') {
            if let Some(end) = s[i + 2..].find('}') {
                let name = &s[i + 2..i + 2 + end];
                if !name.is_empty() {
                    if let Some(v) = env(name) {
                        out.push_str(&v);
                        i += 3 + end;
                        continue;
                    }
                }
            }
            out.push('$');
            i += 1;
        } else {
            let mut j = i + 1;
            while j < b.len() && is_name(b[j]) {
                j += 1;
            }
            let name = &s[i + 1..j];
            match (name.is_empty(), env(name)) {
                (false, Some(v)) => {
                    out.push_str(&v);
                    i = j;
                }
                _ => {
                    out.push('$');
                    i += 1;
                }
            }
        }
    }
    out
}

/// Lexical normalisation of an absolute path: collapses `.`, `..`, duplicate and trailing separators.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

/// Resolves symlinks component by component; a missing tail is appended lexically.
/// Fails on symlink loops and on I/O errors other than "not found".
pub fn resolve(p: &Path) -> io::Result<PathBuf> {
    let mut pending: Vec<std::ffi::OsString> = normalize(p)
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            _ => None,
        })
        .collect();
    pending.reverse();
    let mut result = PathBuf::from("/");
    let mut hops = 0;
    let mut missing = false;
    while let Some(name) = pending.pop() {
        if name == ".." {
            result.pop();
            continue;
        }
        if name == "." {
            continue;
        }
        let cand = result.join(&name);
        if missing {
            result = cand;
            continue;
        }
        match std::fs::symlink_metadata(&cand) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(io::Error::other("too many levels of symbolic links"));
                }
                let target = std::fs::read_link(&cand)?;
                if target.is_absolute() {
                    result = PathBuf::from("/");
                }
                let mut parts: Vec<std::ffi::OsString> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(n) => Some(n.to_owned()),
                        Component::ParentDir => Some("..".into()),
                        _ => None,
                    })
                    .collect();
                parts.reverse();
                pending.extend(parts);
            }
            Ok(_) => result = cand,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                missing = true;
                result = cand;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vars_expand_like_python() {
        let env = |k: &str| (k == "HOME").then(|| "/home/u".to_owned());
        assert_eq!(expand_vars("$HOME/x", &env), "/home/u/x");
        assert_eq!(expand_vars("${HOME}/x", &env), "/home/u/x");
        assert_eq!(expand_vars("$NOPE/x$", &env), "$NOPE/x$");
        assert_eq!(expand_vars("${NOPE}a", &env), "${NOPE}a");
        assert_eq!(expand_user("~/w", Some("/h/")), "/h/w");
        assert_eq!(expand_user("~x/w", Some("/h")), "~x/w");
    }

    #[test]
    fn normalisation_and_resolution() {
        assert_eq!(
            normalize(Path::new("/a/./b//c/../d/")),
            PathBuf::from("/a/b/d")
        );
        assert_eq!(normalize(Path::new("/../a")), PathBuf::from("/a"));
        let dir = tempfile::tempdir().unwrap();
        let root = resolve(dir.path()).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        std::os::unix::fs::symlink("real/../real", root.join("rel")).unwrap();
        assert_eq!(
            resolve(&root.join("link/x/y")).unwrap(),
            root.join("real/x/y")
        );
        assert_eq!(resolve(&root.join("rel")).unwrap(), root.join("real"));
        std::os::unix::fs::symlink(root.join("loop"), root.join("loop")).unwrap();
        assert!(resolve(&root.join("loop")).is_err());
    }
}
