//! Fuzzing of a client's workspace (`cwd`): paths built from the pieces an attacker reaches for
//! (`..`, symlinks out of and within the root, `~`, `$VAR`, `${VAR}`, NUL, empty and odd
//! segments, a file where a directory is expected). Whatever the path, resolving it never panics,
//! never changes the file system, never expands anything, and anything it accepts lies under an
//! allowed root once every symlink is followed. (See `fuzz.rs` for how to run it for longer.)

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use engine::validate::cwd;
use iac_code_agui::config::Config;
use proptest::prelude::*;

use crate::fuzz::fuzz;

/// Every entry under `dir`, recursively (symlinks not followed).
pub(crate) fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

fn segment() -> impl Strategy<Value = String> {
    // The tree's own names and the tricky ones, or any (each as likely as the any).
    const NAMED: &[&str] = &[
        "ws",
        "sub",
        "new",
        "..",
        ".",
        "",
        "link-out",
        "link-in",
        "loop",
        "file",
        "outside",
        "~",
        "$HOME",
        "${IAC_CODE_API_KEY}",
        "a\u{0}b",
    ];
    prop_oneof![
        NAMED.len() as u32 => prop::sample::select(NAMED).prop_map(str::to_owned),
        1 => "\\PC{0,6}",
    ]
}

#[test]
fn fuzz_client_workspaces_never_expand_escape_or_create() {
    let dir = tempfile::tempdir().unwrap();
    let top = std::fs::canonicalize(dir.path()).unwrap();
    let root = top.join("ws");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::create_dir_all(top.join("outside")).unwrap();
    std::fs::write(root.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink(top.join("outside"), root.join("link-out")).unwrap();
    std::os::unix::fs::symlink(root.join("sub"), root.join("link-in")).unwrap();
    std::os::unix::fs::symlink(root.join("loop"), root.join("loop")).unwrap();
    let mut cfg = Config::for_state_dir(top.join("state"), &|k| match k {
        "HOME" => Some(top.to_string_lossy().into_owned()),
        "IAC_CODE_API_KEY" => Some("sk-secret".into()),
        _ => None,
    });
    cfg.allowed_cwds = Some(root.to_string_lossy().into_owned());
    let before = tree(&top);
    // Paths accepted and refused: the target must see both.
    let seen = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let start = prop_oneof![
        Just(format!("{}/", top.display())),
        Just(format!("{}/", root.display())),
        Just("/".to_owned()),
        Just(String::new()),
        Just("~/".to_owned()),
        Just("$HOME/".to_owned()),
    ];
    fuzz(
        "fuzz_client_workspaces_never_expand_escape_or_create",
        (start, prop::collection::vec(segment(), 0..6)),
        |(start, segments)| {
            let raw = format!("{start}{}", segments.join("/"));
            let resolved = cwd::resolve(&raw, &cfg.workspace_roots());
            seen[usize::from(resolved.is_ok())].fetch_add(1, Ordering::Relaxed);
            if raw.starts_with('~') || raw.contains('$') {
                prop_assert!(resolved.is_err(), "expanded {raw:?}");
            }
            if let Ok(ws) = &resolved {
                let p = &ws.path;
                prop_assert!(p.is_absolute(), "{raw:?} -> {p:?}");
                prop_assert!(
                    !p.components()
                        .any(|c| matches!(c, Component::ParentDir | Component::CurDir)),
                    "{raw:?} -> {p:?}"
                );
                prop_assert!(p.starts_with(&root), "{raw:?} escaped to {p:?}");
                prop_assert!(!p.to_string_lossy().contains("sk-secret"), "{raw:?}");
                // Its deepest existing ancestor, all symlinks followed, is under the root too.
                let existing = p.ancestors().find(|a| a.exists()).unwrap();
                let real = std::fs::canonicalize(existing).unwrap();
                prop_assert!(
                    real.starts_with(&root),
                    "{raw:?}: {real:?} outside the root"
                );
            }
            prop_assert_eq!(&tree(&top), &before, "resolving {:?} changed the tree", raw);
            Ok(())
        },
    );
    let [refused, accepted] = seen.map(AtomicUsize::into_inner);
    assert!(
        refused > 0 && accepted > 0,
        "refused {refused}, accepted {accepted}"
    );
}
