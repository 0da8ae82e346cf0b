//! The layout against itself: in no crate does a module import one that imports it back, file by
//! file and between a crate's top modules (ARCHITECTURE.md states the layers). An import is a
//! `crate::…` or `super::…` path outside the test modules; a child's use of its parent is no
//! import back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`run::driver::end`; `` for the crate's root) → its source, test modules cut.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let mut name = rel.to_string_lossy().replace('/', "::");
            if let Some(parent) = name.strip_suffix("::mod") {
                name = parent.to_owned();
            }
            if name == "lib" || name == "main" {
                name = String::new();
            }
            // A module of tests alone (`tests.rs`, `*/tests.rs`) imports what it tests.
            if name == "tests" || name.ends_with("::tests") || name.contains("tests_support") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            out.insert(name, code.to_owned());
        }
    }
    out
}

/// The module `path` names: the longest known prefix of it.
fn resolve<'a>(known: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let mut parts: Vec<&str> = path.split("::").collect();
    while !parts.is_empty() {
        let candidate = parts.join("::");
        if let Some((k, _)) = known.get_key_value(&candidate) {
            return Some(k);
        }
        parts.pop();
    }
    None
}

/// Paths after `prefix` (`crate::`, `super::`), identifiers joined by `::`, each with how many
/// times `prefix` stood before it (`super::super::x`: 2, `x`).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<(usize, &'a str)> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let mut times = 1;
        while let Some(more) = rest.strip_prefix(prefix) {
            times += 1;
            rest = more;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        out.push((times, rest[..end].trim_end_matches(':')));
    }
    out
}

/// Who imports whom, file by file.
fn graph(known: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in known {
        let mut edges = BTreeSet::new();
        for (_, p) in paths_after(code, "crate::") {
            edges.extend(resolve(known, p).map(str::to_owned));
        }
        // `super` is the module's parent (`a::b`'s is `a`, a folder's `mod.rs` included).
        for (ups, p) in paths_after(code, "super::") {
            let mut base: Vec<&str> = m.split("::").filter(|s| !s.is_empty()).collect();
            for _ in 0..ups {
                base.pop();
            }
            base.extend(p.split("::").filter(|s| !s.is_empty()));
            edges.extend(resolve(known, &base.join("::")).map(str::to_owned));
        }
        // A parent is no import back: its children use what it declares.
        edges.retain(|t| t != m && !t.is_empty() && !m.starts_with(&format!("{t}::")));
        g.insert(m.clone(), edges);
    }
    g
}

/// The strongly connected parts of more than one module (Tarjan).
fn circles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut part = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                part.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if part.len() > 1 {
                t.out.push(part);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// The graph between a crate's top modules.
fn top(g: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let head = |m: &str| m.split("::").next().unwrap_or("").to_owned();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, edges) in g {
        let a = head(m);
        let entry = out.entry(a.clone()).or_default();
        entry.extend(edges.iter().map(|t| head(t)).filter(|b| *b != a));
    }
    out
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in ["gateway", "kernel", "a2a", "agui"] {
        let known = modules(&root.join(krate).join("src"));
        assert!(
            known.len() > 1 || krate == "agui",
            "{krate}: no modules read"
        );
        let g = graph(&known);
        assert_eq!(circles(&g), Vec::<Vec<String>>::new(), "{krate}: files");
        assert_eq!(
            circles(&top(&g)),
            Vec::<Vec<String>>::new(),
            "{krate}: top modules"
        );
    }
}

/// The checker finds a circle it is shown, through `crate::` and `super::` alike, and takes a
/// child's use of its parent for none.
#[test]
fn the_layout_check_sees_a_circle() {
    let known: BTreeMap<String, String> = [
        ("", "mod a; mod b; mod c;"),
        ("a", "use crate::b::thing;"),
        ("b", "mod inner; fn f() { crate::c::g() }"),
        ("b::inner", "use super::super::a::x; use super::y;"),
        ("c", "use crate::b;"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let g = graph(&known);
    assert_eq!(g["b::inner"], BTreeSet::from(["a".to_owned()]));
    let mut found = circles(&g);
    found.iter_mut().for_each(|c| c.sort());
    assert_eq!(found, vec![vec!["b".to_owned(), "c".to_owned()]]);
    let mut found = circles(&top(&g));
    found.iter_mut().for_each(|c| c.sort());
    assert_eq!(
        found,
        vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]
    );
}
