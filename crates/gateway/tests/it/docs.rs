//! The documents against the code: every module ARCHITECTURE.md's code map names exists.
//!
//! In the code map, a module is named by its path (`run/hold.rs`, `store/pg/`, `driver/end.rs`:
//! relative to its crate's `src/` or to the folder the surrounding text is about, so a path is
//! found when some file or folder of the workspace ends with it), or by its bare name at the
//! start of a bullet (`- \`cors\`: …`). A module that moved or is gone fails this test until the
//! document follows.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every file and folder under `dir`, as paths relative to the workspace root with `/`.
fn walk(dir: &Path, base: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        // Installed packages are no module of ours.
        if e.file_name() == "node_modules" {
            continue;
        }
        let path = e.path();
        let rel = path
            .strip_prefix(base)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        if path.is_dir() {
            out.insert(format!("{rel}/"));
            walk(&path, base, out);
        } else {
            out.insert(rel);
        }
    }
}

/// The section of ARCHITECTURE.md that maps the code.
fn code_map() -> String {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = doc.find("## Code map").expect("a code map section");
    let end = doc[start..]
        .find("\n## ")
        .map_or(doc.len(), |i| start + i + 1);
    doc[start..end].to_owned()
}

fn is_path(t: &str) -> bool {
    // A route (`/health`) is no module.
    (t.contains('/') || t.ends_with(".rs"))
        && !t.starts_with('/')
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-./".contains(c))
}

fn is_module_name(t: &str) -> bool {
    !t.is_empty() && t.chars().all(|c| c.is_ascii_lowercase() || c == '_')
}

/// The modules the code map names: paths anywhere, bare names at the start of a bullet.
fn named_modules(map: &str) -> (Vec<String>, Vec<String>) {
    let (mut paths, mut names) = (Vec::new(), Vec::new());
    for line in map.lines() {
        let bullet = line.trim_start().strip_prefix("- `");
        if let Some(first) = bullet.and_then(|b| b.split('`').next()) {
            if is_module_name(first) {
                names.push(first.to_owned());
            }
        }
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 1 && is_path(token) {
                paths.push(token.to_owned());
            }
        }
    }
    (paths, names)
}

/// The modules `map` names that `tree` does not have.
fn missing(map: &str, tree: &BTreeSet<String>) -> Vec<String> {
    let (paths, names) = named_modules(map);
    let paths = paths.into_iter().filter(|p| {
        let p = p.trim_start_matches("./").trim_end_matches('/');
        let dir = format!("{p}/");
        !tree.iter().any(|t| {
            t == p || *t == dir || t.ends_with(&format!("/{p}")) || t.ends_with(&format!("/{dir}"))
        })
    });
    let names = names.into_iter().filter(|n| {
        !tree
            .iter()
            .any(|t| t.ends_with(&format!("/{n}.rs")) || t.ends_with(&format!("/{n}/")))
    });
    paths.chain(names).collect()
}

#[test]
fn every_module_the_architecture_names_exists() {
    let base = root().canonicalize().unwrap();
    let mut tree = BTreeSet::new();
    for top in [
        "crates",
        "conformance",
        "clients",
        "console",
        "scripts",
        "ops",
        "packaging",
    ] {
        walk(&base.join(top), &base, &mut tree);
    }
    let map = code_map();
    let (paths, names) = named_modules(&map);
    assert!(paths.len() > 20 && names.len() > 10, "{paths:?} {names:?}");
    let gone = missing(&map, &tree);
    assert!(
        gone.is_empty(),
        "ARCHITECTURE.md names modules that do not exist: {gone:?}"
    );
}

#[test]
fn a_module_that_is_gone_is_noticed() {
    let tree: BTreeSet<String> = ["crates/gateway/src/run/", "crates/gateway/src/run/hold.rs"]
        .map(String::from)
        .into();
    let map = "## Code map\n- `run/`: `run/hold.rs`, `hold.rs`, `run/gone.rs`, `x/`, `/route`.\n\
               - `hold`: here. - `gone`: not.\n- `nothing_here`: gone.\n";
    assert_eq!(missing(map, &tree), ["run/gone.rs", "x/", "nothing_here"]);
}
