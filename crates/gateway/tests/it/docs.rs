//! The documents against the code.
//!
//! - ARCHITECTURE.md's code map names modules that exist.
//! - The book (`docs/`): its configuration table has every option of `iac-code-agui --help` and
//!   no other; its error table every code with its status; its metrics table every family the
//!   gateway registers (and the type the binary exposes it as); its HTTP API page every route the
//!   code registers and no other; every test its guarantees name exists; every relative link of
//!   the book, and of the README into it, reaches a page and a heading.
//! - The README stays a front page (at most 12 KiB, its two set-up commands).
//!
//! Each check reads the code as it is (the binary's `--help`, the public error codes, the source
//! text under `crates/*/src`), so a change that leaves a page behind fails here until the page
//! follows. The `…_is_noticed` tests show each parser catching what it is there for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use iac_code_agui::error::{Code, Status as _};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every file and folder under `dir`, as paths relative to `base` with `/` (folders end with
/// `/`).
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

/// The `.rs` files of every crate's `src/` (relative to the workspace root).
fn crate_sources() -> Vec<String> {
    let base = root();
    let mut tree = BTreeSet::new();
    walk(&base.join("crates"), &base, &mut tree);
    tree.into_iter()
        .filter(|p| p.ends_with(".rs") && p.split('/').nth(2) == Some("src"))
        .collect()
}

/// The code of a source file without its test modules (`#[cfg(test)]` followed by a `mod`).
fn without_tests(src: &str) -> &str {
    let mut at = 0;
    while let Some(i) = src[at..].find("#[cfg(test)]") {
        let start = at + i;
        let after = src[start + "#[cfg(test)]".len()..].trim_start();
        if after.starts_with("mod ") || after.starts_with("pub mod ") {
            return &src[..start];
        }
        at = start + 1;
    }
    src
}

// ----------------------------------------------------------------------------------------------
// Markdown: code blocks, tables, headings, links.

/// `text` with fenced code blocks blanked (their lines kept, empty), so that neither a `#` line
/// nor a link inside one counts.
fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let t = line.trim_start();
        match fence {
            Some(f) => {
                if t.starts_with(f) {
                    fence = None;
                }
                out.push('\n');
            }
            None if t.starts_with("```") || t.starts_with("~~~") => {
                fence = Some(&t[..3]);
                out.push('\n');
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The cells of a table row (`| a | b \| c |`), split at unescaped `|`, trimmed.
fn cells(row: &str) -> Vec<String> {
    let row = row.trim();
    let row = row.strip_prefix('|').unwrap_or(row);
    let row = row.strip_suffix('|').unwrap_or(row);
    let (mut out, mut cell, mut escaped) = (Vec::new(), String::new(), false);
    for c in row.chars() {
        match c {
            '|' if !escaped => out.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => {
                escaped = c == '\\';
                cell.push(c);
            }
        }
    }
    out.push(cell.trim().to_owned());
    out
}

/// The rows (as cells) of every table of `text` whose header row starts with `header`.
fn tables(text: &str, header: &str) -> Vec<Vec<String>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_start().starts_with(header) {
            i += 2; // the header and its `|---|` line
            while i < lines.len() && lines[i].trim_start().starts_with('|') {
                rows.push(cells(lines[i]));
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    rows
}

/// The code spans of `text` (between backticks).
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// mdBook's id of a heading: the text as rendered (code marks, emphasis and links' targets
/// gone), lowercased, whitespace made `-`, every other character that is not alphanumeric, `-`
/// or `_` dropped.
fn anchor(heading: &str) -> String {
    // A link keeps its text: `[text](url)` → `text`.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(i) = rest.find("](") {
        text.push_str(&rest[..i]);
        rest = rest[i..].find(')').map_or("", |j| &rest[i + j + 1..]);
    }
    text.push_str(rest);
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_ascii_lowercase())
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The ids of a page's headings, as mdBook makes them (a repeated id gets `-1`, `-2`, …).
fn heading_ids(page: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut ids = BTreeSet::new();
    for line in without_fences(page).lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let id = anchor(&line[hashes..]);
            let n = seen.entry(id.clone()).or_insert(0);
            ids.insert(match *n {
                0 => id,
                n => format!("{id}-{n}"),
            });
            *n += 1;
        }
    }
    ids
}

/// The targets of a page's Markdown links (`](target)`), outside code blocks and code spans.
fn link_targets(page: &str) -> Vec<String> {
    let text = without_fences(page);
    // Code spans out: what is between backticks on a line is no link.
    let prose: String = text
        .lines()
        .map(|l| l.split('`').step_by(2).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = prose.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(j) = rest.find(')') {
            out.push(rest[..j].trim().to_owned());
            rest = &rest[j..];
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|s| target.starts_with(s))
}

/// Lexically normalised `a/b/../c` → `a/c`; `None` when it climbs above its start.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The broken links of the documents `docs` (workspace-relative path → text): a relative link
/// must reach a file of `files` (workspace-relative), inside `within` when the document is, and
/// its anchor a heading of that page (or of the document itself for `#anchor`).
fn broken_links(docs: &BTreeMap<String, String>, files: &BTreeSet<String>) -> Vec<String> {
    let mut broken = Vec::new();
    for (path, text) in docs {
        let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
        for target in link_targets(text) {
            if is_external(&target) {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((&target, ""));
            let dest = match file {
                "" => Some(path.clone()),
                f => normalize(&format!("{dir}/{f}")),
            };
            let Some(dest) = dest.filter(|d| files.contains(d)) else {
                broken.push(format!("{path}: {target} (no such file)"));
                continue;
            };
            // A page of the book links to pages of the book: mdBook renders only those.
            if path.starts_with("docs/src/") && !dest.starts_with("docs/src/") {
                broken.push(format!("{path}: {target} (outside the book)"));
                continue;
            }
            if !frag.is_empty() {
                let page = docs
                    .get(&dest)
                    .cloned()
                    .or_else(|| std::fs::read_to_string(root().join(&dest)).ok())
                    .unwrap_or_default();
                if !heading_ids(&page).contains(frag) {
                    broken.push(format!("{path}: {target} (no heading #{frag})"));
                }
            }
        }
    }
    broken
}

/// The book's pages: workspace-relative path → text.
fn book() -> BTreeMap<String, String> {
    let base = root();
    let mut tree = BTreeSet::new();
    walk(&base.join("docs/src"), &base, &mut tree);
    tree.into_iter()
        .filter(|p| p.ends_with(".md"))
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect()
}

fn page(rel: &str) -> String {
    read(&format!("docs/src/{rel}"))
}

// ----------------------------------------------------------------------------------------------
// ARCHITECTURE.md's code map.

/// The section of ARCHITECTURE.md that maps the code.
fn code_map() -> String {
    let doc = read("ARCHITECTURE.md");
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
    let base = root();
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

// ----------------------------------------------------------------------------------------------
// The configuration table against `--help`.

/// What `--help` says of each long option: its name (`--host`) → its variable, if any.
struct Help {
    options: BTreeMap<String, Option<String>>,
    /// The YAML keys `--config` lists.
    yaml_keys: Vec<String>,
}

fn parse_help(help: &str) -> Help {
    let mut options = BTreeMap::new();
    let mut yaml_keys = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        if !t.starts_with('-') {
            continue;
        }
        // The option's own part ends where the description starts (two spaces).
        let spec = t.split("  ").next().unwrap_or_default();
        let env = line
            .split_once("[env: ")
            .and_then(|(_, e)| e.split_once('='))
            .map(|(name, _)| name.to_owned());
        for word in spec.split([' ', ',']) {
            if let Some(name) = word.strip_prefix("--") {
                if !name.is_empty() {
                    options.insert(format!("--{name}"), env.clone());
                }
            }
        }
        if spec.starts_with("--config") {
            if let Some((_, keys)) = line.split_once("(keys: ") {
                let keys = keys.split(';').next().unwrap_or_default();
                yaml_keys = keys.split(", ").map(|k| k.trim().to_owned()).collect();
            }
        }
    }
    Help { options, yaml_keys }
}

/// A row of the configuration table: its flags, variables and YAML keys.
#[derive(Debug, Default)]
struct ConfigRow {
    flags: Vec<String>,
    envs: Vec<String>,
    keys: Vec<String>,
}

fn words_with_prefix(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let word: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .collect();
        rest = &rest[i + word.len().max(1)..];
        if word.len() > prefix.len() {
            out.push(word);
        }
    }
    out
}

fn config_rows(page: &str) -> Vec<ConfigRow> {
    tables(page, "| Flag | Env | YAML |")
        .into_iter()
        .map(|c| {
            let cell = |i: usize| c.get(i).cloned().unwrap_or_default();
            // A YAML key is a code span outside parentheses (those hold values: `true`, …).
            let mut yaml = String::new();
            let mut depth = 0usize;
            for ch in cell(2).chars() {
                match ch {
                    '(' => depth += 1,
                    ')' => depth = depth.saturating_sub(1),
                    _ if depth == 0 => yaml.push(ch),
                    _ => {}
                }
            }
            ConfigRow {
                flags: words_with_prefix(&cell(0), "--"),
                envs: words_with_prefix(&cell(1), "IAC_CODE_AGUI_"),
                keys: code_spans(&yaml).into_iter().map(str::to_owned).collect(),
            }
        })
        .collect()
}

/// What the configuration table lacks or has too many, against `help`.
fn config_mismatches(help: &Help, rows: &[ConfigRow], sources: &str) -> Vec<String> {
    let mut out = Vec::new();
    // Options every program has; the page says `--help` lists the others.
    let generic = ["--help", "--version"];
    let in_help: BTreeSet<&String> = help
        .options
        .keys()
        .filter(|o| !generic.contains(&o.as_str()))
        .collect();
    let in_table: BTreeSet<&String> = rows.iter().flat_map(|r| &r.flags).collect();
    for o in in_help.difference(&in_table) {
        out.push(format!("{o} is in --help but not in the table"));
    }
    for o in in_table.difference(&in_help) {
        out.push(format!("the table names {o}, which --help does not list"));
    }
    for (option, env) in &help.options {
        let Some(env) = env else { continue };
        let row = rows.iter().find(|r| r.flags.contains(option));
        if let Some(row) = row.filter(|r| !r.envs.contains(env)) {
            out.push(format!(
                "the row of {option} does not name its variable {env}: {:?}",
                row.envs
            ));
        }
    }
    let keys: BTreeSet<&String> = rows.iter().flat_map(|r| &r.keys).collect();
    for k in &help.yaml_keys {
        if !keys.contains(k) {
            out.push(format!("the YAML key {k} (--config) is not in the table"));
        }
    }
    // A variable the table names, the gateway reads (a name in its source).
    for env in rows.iter().flat_map(|r| &r.envs) {
        if !sources.contains(&format!("\"{env}\"")) {
            out.push(format!(
                "the table names {env}, which the gateway does not read"
            ));
        }
    }
    out
}

#[test]
fn the_configuration_table_has_every_option_of_help_and_no_other() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iac-code-agui"))
        .arg("--help")
        .env("COLUMNS", "1000")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = parse_help(&String::from_utf8(out.stdout).unwrap());
    assert!(help.options.len() > 40, "{:?}", help.options.keys());
    assert!(help.yaml_keys.len() > 40, "{:?}", help.yaml_keys);
    let rows = config_rows(&page("guide/configuration.md"));
    assert!(
        rows.len() > 30,
        "the configuration table: {} rows",
        rows.len()
    );
    // The gateway's crates (the test kit's and the benchmark's names are no reading).
    let sources: String = crate_sources()
        .iter()
        .filter(|p| !p.starts_with("crates/testkit/") && !p.starts_with("crates/bench/"))
        .map(|p| read(p))
        .collect();
    let wrong = config_mismatches(&help, &rows, &sources);
    assert!(
        wrong.is_empty(),
        "docs/src/guide/configuration.md against `iac-code-agui --help`:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_configuration_table_out_of_step_with_help_is_noticed() {
    let help = parse_help(
        "Options:\n      --config <PATH>   YAML (keys: host, port, shiny; dashes)\n      \
         --host <HOST>     Bind [default: x] [env: IAC_CODE_AGUI_HOST=]\n  -d, --debug     Debug\n      \
         --new-thing <N>   New [env: IAC_CODE_AGUI_NEW_THING=]\n  -h, --help   Print help\n",
    );
    let rows = config_rows(
        "| Flag | Env | YAML | Default | Meaning |\n|---|---|---|---|---|\n\
         | `--config PATH` | – | – | – | YAML |\n\
         | `--host` | `IAC_CODE_AGUI_PORT` | `host` (`a`) | x | y |\n\
         | `--debug`, `-d` | – | `debug` | off | z |\n\
         | `--gone N` | `IAC_CODE_AGUI_GONE` | `port` | 1 | w |\n",
    );
    let wrong = config_mismatches(&help, &rows, "\"IAC_CODE_AGUI_PORT\"");
    assert_eq!(
        wrong,
        [
            "--new-thing is in --help but not in the table",
            "the table names --gone, which --help does not list",
            "the row of --host does not name its variable IAC_CODE_AGUI_HOST: [\"IAC_CODE_AGUI_PORT\"]",
            "the YAML key shiny (--config) is not in the table",
            "the table names IAC_CODE_AGUI_GONE, which the gateway does not read",
        ]
    );
}

/// The systemd unit's environment file names only variables the book documents (the gateway's,
/// and the kernel's provider settings).
#[test]
fn every_variable_of_the_service_environment_file_is_in_the_book() {
    let text = read("packaging/systemd/iac-code-agui.env");
    let book: String = book().into_values().collect();
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.trim_start_matches('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    for n in names {
        assert!(book.contains(n), "{n} is not documented in docs/src");
    }
}

// ----------------------------------------------------------------------------------------------
// The error table.

/// The rows of the error table: code → its status cell(s).
fn error_rows(page: &str) -> Vec<(String, String)> {
    tables(page, "| Code | HTTP status |")
        .into_iter()
        .map(|c| {
            let name = c[0].trim_matches('`').to_owned();
            (name, c.get(1).cloned().unwrap_or_default())
        })
        .collect()
}

fn error_mismatches(rows: &[(String, String)], codes: &[(&str, u16)]) -> Vec<String> {
    let mut out = Vec::new();
    for &(code, status) in codes {
        let found: Vec<_> = rows.iter().filter(|(n, _)| n == code).collect();
        match found.as_slice() {
            [(_, s)] if *s == status.to_string() => {}
            [(_, s)] => out.push(format!("{code}: the table says {s}, the code {status}")),
            f => out.push(format!("{code}: {} rows", f.len())),
        }
    }
    for (name, _) in rows {
        if !codes.iter().any(|(c, _)| c == name) {
            out.push(format!("{name}: no such code"));
        }
    }
    out
}

/// docs/src/reference/errors.md: one row per code with its status, and no row for a code
/// that does not exist.
#[test]
fn the_error_table_lists_every_code_with_its_status() {
    let codes: Vec<(&str, u16)> = <Code as strum::VariantArray>::VARIANTS
        .iter()
        .map(|c| (c.as_str(), c.status().as_u16()))
        .collect();
    assert!(codes.len() > 30);
    for (name, _) in &codes {
        assert!(Code::from_wire(name).is_some());
    }
    let wrong = error_mismatches(&error_rows(&page("reference/errors.md")), &codes);
    assert!(
        wrong.is_empty(),
        "docs/src/reference/errors.md against iac_code_agui::error::Code:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn an_error_table_out_of_step_is_noticed() {
    let page = "| Code | HTTP status | When | Meaning |\n|---|---|---|---|\n\
                | `A` | 409 | JSON | x |\n| `B` | 400 | JSON | y |\n| `C` | 1 | z | z |\n";
    assert_eq!(
        error_mismatches(&error_rows(page), &[("A", 409), ("B", 404), ("D", 500)]),
        [
            "B: the table says 400, the code 404",
            "D: 0 rows",
            "C: no such code"
        ]
    );
}

// ----------------------------------------------------------------------------------------------
// The metrics table.

/// The metric families the source registers: the `"agui_…"` names in the code (tests aside)
/// of the files that use `prometheus_client`.
fn registered_families(files: &[(String, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, src) in files {
        if !src.contains("prometheus_client") {
            continue;
        }
        for lit in without_tests(src).split('"').skip(1).step_by(2) {
            if lit.starts_with("agui_")
                && lit
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                out.insert(lit.to_owned());
            }
        }
    }
    out
}

/// The metrics table: family → its type.
fn metric_rows(page: &str) -> BTreeMap<String, String> {
    tables(page, "| Family | Type |")
        .into_iter()
        .map(|c| (c[0].trim_matches('`').to_owned(), c[1].clone()))
        .collect()
}

/// `prometheus-client` exposes a counter `x` as `x_total`.
fn metric_mismatches(
    registered: &BTreeSet<String>,
    rows: &BTreeMap<String, String>,
    exposed: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    let base = |name: &str| name.strip_suffix("_total").unwrap_or(name).to_owned();
    for r in registered {
        if !rows.keys().any(|n| base(n) == *r) {
            out.push(format!("{r} is registered but not in the table"));
        }
    }
    for (name, kind) in rows {
        if !registered.contains(&base(name)) {
            out.push(format!("the table names {name}, which is not registered"));
        }
        if kind.starts_with("counter") != name.ends_with("_total") {
            out.push(format!(
                "{name}: a counter's name ends with _total, no other's"
            ));
        }
        if let Some(e) = exposed.get(&base(name)) {
            if !kind.starts_with(e.as_str()) {
                out.push(format!("{name}: the table says {kind}, /metrics says {e}"));
            }
        }
    }
    out
}

/// The families `/metrics` shows (their `# TYPE` lines): base name → type.
fn exposed_families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| {
            let n = n.strip_suffix("_total").unwrap_or(n);
            (n.to_owned(), t.trim().to_owned())
        })
        .collect()
}

/// The binary's `/metrics` (an external kernel nobody answers on; no run): what it shows.
fn scrape_the_binary() -> String {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (port, admin, nobody) = (
        testkit::free_port(),
        testkit::free_port(),
        testkit::free_port(),
    );
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_iac-code-agui"))
        .args(["--port", &port.to_string()])
        .args(["--metrics-listen", &format!("127.0.0.1:{admin}")])
        .args(["--a2a-url", &format!("http://127.0.0.1:{nobody}/")])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .env("IAC_CODE_AGUI_ALLOWED_CWDS", dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let text = loop {
        let answer = std::net::TcpStream::connect(("127.0.0.1", admin)).and_then(|mut s| {
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
            let mut raw = String::new();
            s.read_to_string(&mut raw)?;
            Ok(raw)
        });
        match answer {
            Ok(raw) if raw.starts_with("HTTP/1.1 200") => break raw,
            _ if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                panic!("the binary's /metrics did not answer: {answer:?}");
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    text
}

#[test]
fn the_metrics_table_names_every_family_the_gateway_registers() {
    let files: Vec<(String, String)> = crate_sources()
        .into_iter()
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect();
    let registered = registered_families(&files);
    assert!(registered.len() > 20, "{registered:?}");
    let exposed = exposed_families(&scrape_the_binary());
    // The binary shows, before any run, at least the families without labels.
    assert!(exposed.len() > 10, "{exposed:?}");
    for family in exposed.keys() {
        assert!(
            registered.contains(family),
            "/metrics shows {family}, which the source parse missed"
        );
    }
    let rows = metric_rows(&page("operations/observability.md"));
    let wrong = metric_mismatches(&registered, &rows, &exposed);
    assert!(
        wrong.is_empty(),
        "the metrics table of docs/src/operations/observability.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_metrics_table_out_of_step_is_noticed() {
    let files = vec![(
        "m.rs".to_owned(),
        "use prometheus_client::x;\nr.register(\"agui_runs\", ..);\nr.register(\n  \"agui_up\", ..);\n\
         \"agui_new\"\n#[cfg(test)]\nmod tests { \"agui_test_only\" }\n"
            .to_owned(),
    )];
    let registered = registered_families(&files);
    assert_eq!(
        registered,
        ["agui_new", "agui_runs", "agui_up"]
            .map(String::from)
            .into()
    );
    let rows = metric_rows(
        "| Family | Type | Labels | What |\n|---|---|---|---|\n\
         | `agui_runs_total` | counter | | a |\n| `agui_up` | counter | | b |\n\
         | `agui_old` | gauge | | c |\n",
    );
    let exposed: BTreeMap<String, String> = [("agui_runs".to_owned(), "gauge".to_owned())].into();
    assert_eq!(
        metric_mismatches(&registered, &rows, &exposed),
        [
            "agui_new is registered but not in the table",
            "the table names agui_old, which is not registered",
            "agui_runs_total: the table says counter, /metrics says gauge",
            "agui_up: a counter's name ends with _total, no other's",
        ]
    );
}

// ----------------------------------------------------------------------------------------------
// The routes.

/// A route with its parameters' names blanked: `/threads/{thread_id}` → `/threads/{}`.
fn route_shape(path: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in path.chars() {
        match c {
            '{' => {
                in_param = true;
                out.push_str("{}");
            }
            '}' => in_param = false,
            _ if !in_param => out.push(c),
            _ => {}
        }
    }
    out
}

/// The paths of `.route("…", …)` calls in the code (tests aside) of `files`.
fn registered_routes(files: &[(String, String)]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, src) in files {
        let code = without_tests(src);
        let mut rest = code;
        while let Some(i) = rest.find(".route(") {
            rest = &rest[i + ".route(".len()..];
            let arg = rest.trim_start();
            if let Some(lit) = arg.strip_prefix('"').and_then(|a| a.split_once('"')) {
                out.insert(route_shape(lit.0));
            }
        }
    }
    out
}

/// The routes of the HTTP API page's tables (the first cell's code spans: `GET /threads`).
fn documented_routes(page: &str) -> BTreeSet<String> {
    tables(page, "| Route |")
        .iter()
        .flat_map(|c| {
            code_spans(&c[0])
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|span| {
            span.split(' ')
                .find(|w| w.starts_with('/'))
                .map(|w| route_shape(w.split('?').next().unwrap_or(w)))
        })
        .collect()
}

#[test]
fn the_http_api_page_names_every_route_and_no_other() {
    // Every crate but the test kit's fakes and the benchmark's.
    let files: Vec<(String, String)> = crate_sources()
        .into_iter()
        .filter(|p| !p.starts_with("crates/testkit/") && !p.starts_with("crates/bench/"))
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect();
    let code = registered_routes(&files);
    assert!(code.len() > 15, "{code:?}");
    let doc = documented_routes(&page("reference/http-api.md"));
    let missing: Vec<_> = code.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&code).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "docs/src/reference/http-api.md lacks routes {missing:?} and names routes the code \
         does not register {extra:?}"
    );
}

#[test]
fn a_route_out_of_step_is_noticed() {
    let files = vec![(
        "a.rs".to_owned(),
        "Router::new().route(\"/a/{thread_id}\", any(x))\n  .route(\n    \"/b\", get(y));\n\
         #[cfg(test)]\nmod tests { Router::new().route(\"/test-only\", get(z)); }\n"
            .to_owned(),
    )];
    assert_eq!(
        registered_routes(&files),
        ["/a/{}", "/b"].map(String::from).into()
    );
    let doc = documented_routes(
        "| Route | Auth | |\n|---|---|---|\n| `GET`/`HEAD /a/{threadId}` | x | `/not-a-route` |\n\
         | `POST /c?x=1` | y | z |\n",
    );
    assert_eq!(doc, ["/a/{}", "/c"].map(String::from).into());
}

// ----------------------------------------------------------------------------------------------
// The guarantees' tests.

/// A test name of the guarantees: a path (`module::test`, `path::tests::*`), a bare test name
/// (of the module named before it in its cell), or a file of the repository.
#[derive(Debug, PartialEq)]
enum Named {
    Path(Vec<String>),
    File(String),
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

/// The names a cell of the Tests column holds.
fn named_tests(cell: &str) -> Vec<Named> {
    let mut out = Vec::new();
    let mut module: Option<Vec<String>> = None;
    for span in code_spans(cell) {
        let segs: Vec<&str> = span.split("::").collect();
        if segs.len() > 1
            && segs[..segs.len() - 1].iter().all(|s| is_ident(s))
            && (is_ident(segs[segs.len() - 1]) || segs[segs.len() - 1] == "*")
        {
            let path: Vec<String> = segs.iter().map(|s| (*s).to_owned()).collect();
            module = Some(path[..path.len() - 1].to_vec());
            out.push(Named::Path(path));
        } else if is_ident(span) && span.matches('_').count() >= 3 {
            // A bare test name: of the module of the name before it.
            let mut path = module.clone().unwrap_or_default();
            path.push(span.to_owned());
            out.push(Named::Path(path));
        } else if span.contains('/')
            && !span.starts_with('/')
            && !span.contains(' ')
            && span.rsplit('/').next().is_some_and(|f| f.contains('.'))
        {
            out.push(Named::File(span.to_owned()));
        }
    }
    out
}

/// Source files as the resolver sees them: workspace-relative path → text.
type Files = BTreeMap<String, String>;

/// Whether the module in `file` (its text from `text`) has the item `segs` names: a `fn` (a
/// test, or a helper such as `testkit::sse::assert_valid_run`), a submodule (inline, or a file
/// beside it) followed by the rest, or `*` (it has tests).
fn resolve(files: &Files, file: &str, text: &str, segs: &[String]) -> bool {
    let Some((first, rest)) = segs.split_first() else {
        return false;
    };
    if first == "*" {
        return rest.is_empty() && module_has_tests(files, file, text);
    }
    if rest.is_empty() {
        return text.contains(&format!("fn {first}(")) || text.contains(&format!("fn {first}<"));
    }
    // An inline submodule: what follows it in the file.
    for decl in [format!("mod {first} {{"), format!("mod {first}{{")] {
        if let Some(i) = text.find(&decl) {
            if resolve(files, file, &text[i..], rest) {
                return true;
            }
        }
    }
    submodule_files(files, file, first)
        .into_iter()
        .any(|f| resolve(files, &f, &files[&f], rest))
}

/// The files a submodule `name` of the module in `file` may be in.
fn submodule_files(files: &Files, file: &str, name: &str) -> Vec<String> {
    let (dir, stem) = file.rsplit_once('/').unwrap_or(("", file));
    let stem = stem.trim_end_matches(".rs");
    let base = match stem {
        "mod" | "lib" | "main" => dir.to_owned(),
        s => format!("{dir}/{s}"),
    };
    [format!("{base}/{name}.rs"), format!("{base}/{name}/mod.rs")]
        .into_iter()
        .filter(|f| files.contains_key(f))
        .collect()
}

fn module_has_tests(files: &Files, file: &str, text: &str) -> bool {
    let has =
        |t: &str| t.contains("#[test]") || t.contains("#[tokio::test") || t.contains("proptest!");
    if has(text) {
        return true;
    }
    // Or in its own folder's files (`run/decide/…`).
    let dir = match file.rsplit_once('/') {
        Some((d, f)) if f == "mod.rs" || f == "lib.rs" || f == "main.rs" => format!("{d}/"),
        _ => format!("{}/", file.trim_end_matches(".rs")),
    };
    files
        .iter()
        .any(|(p, t)| p.starts_with(&dir) && p != file && has(t))
}

/// Where a guarantee's test path may start: the gateway's integration tests, and each crate's
/// root (with or without the crate's name in front, as modules move between crates).
fn resolve_test(files: &Files, path: &[String]) -> bool {
    let it = "crates/gateway/tests/it/main.rs";
    if files.contains_key(it) && resolve(files, it, &files[it], path) {
        return true;
    }
    let roots = files.keys().filter(|p| {
        let parts: Vec<&str> = p.split('/').collect();
        parts.len() == 4 && parts[2] == "src" && (parts[3] == "lib.rs" || parts[3] == "main.rs")
    });
    for r in roots {
        let krate = r.split('/').nth(1).unwrap_or_default();
        if resolve(files, r, &files[r], path) {
            return true;
        }
        let names = [krate.to_owned(), krate.replace('-', "_")];
        if path.len() > 1 && names.contains(&path[0]) && resolve(files, r, &files[r], &path[1..]) {
            return true;
        }
    }
    false
}

/// The guarantees' tests that do not exist, against the files `files` (all `.rs`, and the
/// others the names point at).
fn missing_tests(page: &str, files: &Files, exists: &dyn Fn(&str) -> bool) -> (usize, Vec<String>) {
    let mut count = 0;
    let mut gone = Vec::new();
    for row in tables(page, "| Guarantee | Tests |") {
        let cell = row.get(1).cloned().unwrap_or_default();
        for named in named_tests(&cell) {
            count += 1;
            match named {
                Named::Path(p) if !resolve_test(files, &p) => gone.push(p.join("::")),
                Named::File(f) if !exists(&f) => gone.push(f),
                _ => {}
            }
        }
    }
    (count, gone)
}

#[test]
fn every_test_the_guarantees_name_exists() {
    let base = root();
    let mut tree = BTreeSet::new();
    walk(&base.join("crates"), &base, &mut tree);
    let files: Files = tree
        .into_iter()
        .filter(|p| p.ends_with(".rs"))
        .map(|p| {
            let text = read(&p);
            (p, text)
        })
        .collect();
    let exists = |f: &str| base.join(f).is_file();
    let (count, gone) = missing_tests(&page("reference/guarantees.md"), &files, &exists);
    assert!(count > 150, "only {count} test names found");
    assert!(
        gone.is_empty(),
        "docs/src/reference/guarantees.md names tests that do not exist:\n{}",
        gone.join("\n")
    );
}

#[test]
fn a_renamed_test_of_the_guarantees_is_noticed() {
    let files: Files = [
        ("crates/gateway/tests/it/main.rs", "mod chaos;\nmod fake_kernel;\n"),
        (
            "crates/gateway/tests/it/chaos.rs",
            "#[tokio::test]\nasync fn every_fault_ends() {}\nasync fn a_kernel_restart_is_seen() {}\n",
        ),
        ("crates/gateway/tests/it/fake_kernel/mod.rs", "mod turn;\n"),
        ("crates/gateway/tests/it/fake_kernel/turn.rs", "#[tokio::test]\nasync fn t1() {}\n"),
        ("crates/gateway/src/lib.rs", "pub mod run;\n"),
        ("crates/gateway/src/run/mod.rs", "pub mod decide;\n#[cfg(test)]\nmod tests {\n#[test]\nfn held() {}\n}\n"),
        ("crates/gateway/src/run/decide.rs", "proptest! { fn p(x in 0..1) {} }\n"),
        ("crates/kernel/src/lib.rs", "pub mod pool;\n"),
        ("crates/kernel/src/pool.rs", "#[cfg(test)]\nmod tests {\n#[test]\nfn placed() {}\n}\n"),
        ("crates/testkit/src/lib.rs", "pub mod sse;\n"),
        ("crates/testkit/src/sse.rs", "pub fn assert_valid_run() {}\n"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_owned(), t.to_owned()))
    .collect();
    let page = "| Guarantee | Tests |\n|---|---|\n\
        | a | `chaos::every_fault_ends`, `a_kernel_restart_is_seen`, `fake_kernel::turn::t1`, `--flag`, `null` |\n\
        | b | `run::tests::held`, `run::decide::*`, `kernel::pool::tests::*`, `pool::tests::placed`, `testkit::sse::assert_valid_run` |\n\
        | c | `chaos::every_fault_ends_renamed`, `a_kernel_restart_is_gone_now`, `fake_kernel::turn::t2`, `run::tests::gone`, `kernel::pool::tests::unplaced`, `console/test/a.test.mjs`, `run::nothing::*` |\n";
    let exists = |f: &str| f == "clients/js/test/agent.test.mjs";
    let (count, gone) = missing_tests(page, &files, &exists);
    assert_eq!(count, 15);
    assert_eq!(
        gone,
        [
            "chaos::every_fault_ends_renamed",
            "chaos::a_kernel_restart_is_gone_now",
            "fake_kernel::turn::t2",
            "run::tests::gone",
            "kernel::pool::tests::unplaced",
            "console/test/a.test.mjs",
            "run::nothing::*",
        ]
    );
}

// ----------------------------------------------------------------------------------------------
// Links, the summary and the README.

#[test]
fn every_link_of_the_book_and_the_readme_reaches_a_page_and_a_heading() {
    let base = root();
    let mut files = BTreeSet::new();
    for top in [
        "docs",
        "crates",
        "clients",
        "console",
        "conformance",
        "ops",
        "packaging",
        "scripts",
    ] {
        walk(&base.join(top), &base, &mut files);
    }
    for f in [
        "README.md",
        "BENCHMARKS.md",
        "DEPLOYMENT.md",
        "ARCHITECTURE.md",
    ] {
        if base.join(f).is_file() {
            files.insert(f.to_owned());
        }
    }
    let mut docs = book();
    assert!(docs.len() > 15, "{:?}", docs.keys());
    for f in ["README.md", "BENCHMARKS.md", "DEPLOYMENT.md"] {
        if base.join(f).is_file() {
            docs.insert(f.to_owned(), read(f));
        }
    }
    let broken = broken_links(&docs, &files);
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    let readme_into_book = link_targets(&docs["README.md"])
        .iter()
        .filter(|t| t.starts_with("docs/"))
        .count();
    assert!(
        readme_into_book > 10,
        "the README links into the book {readme_into_book} times"
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary_and_every_include_is_there() {
    let pages = book();
    let summary = &pages["docs/src/SUMMARY.md"];
    let listed: BTreeSet<String> = link_targets(summary)
        .into_iter()
        .map(|t| format!("docs/src/{t}"))
        .collect();
    for p in pages.keys().filter(|p| !p.ends_with("/SUMMARY.md")) {
        assert!(listed.contains(p), "{p} is not in docs/src/SUMMARY.md");
    }
    for (p, text) in &pages {
        let dir = p.rsplit_once('/').map_or("", |(d, _)| d);
        for inc in text.split("{{#include ").skip(1) {
            let inc = inc.split("}}").next().unwrap_or_default().trim();
            let (file, name) = inc.split_once(':').unwrap_or((inc, ""));
            let target = normalize(&format!("{dir}/{file}")).unwrap_or_default();
            let included = read(&target);
            if !name.is_empty() {
                assert!(
                    included.contains(&format!("ANCHOR: {name}"))
                        && included.contains(&format!("ANCHOR_END: {name}")),
                    "{p} includes {inc}: no anchor {name} in {target}"
                );
            }
        }
    }
}

#[test]
fn a_broken_link_is_noticed() {
    assert_eq!(anchor(" `@ag-ui/client` 1.0"), "ag-uiclient-10");
    assert_eq!(
        anchor(" Behaviour differing (by decision)"),
        "behaviour-differing-by-decision"
    );
    assert_eq!(
        anchor(" [The `/live` route](x.md), `max_runs`"),
        "the-live-route-max_runs"
    );
    let docs: BTreeMap<String, String> = [
        (
            "docs/src/guide/a.md",
            "# A\n## Two\n## Two\n[ok](b.md#b) [ok](#two-1) [gone](c.md) [no](b.md#nope) \
             [up](../../../README.md) `[code](gone.md)`\n```\n[fenced](gone.md)\n# not a heading\n```\n\
             [web](https://example.com) [h](#not-a-heading)\n",
        ),
        ("docs/src/guide/b.md", "# B\n"),
        ("README.md", "[book](docs/src/guide/a.md#two) [gone](docs/src/guide/z.md#a)\n"),
    ]
    .into_iter()
    .map(|(p, t)| (p.to_owned(), t.to_owned()))
    .collect();
    let files: BTreeSet<String> = docs.keys().cloned().collect();
    assert_eq!(
        broken_links(&docs, &files),
        [
            "README.md: docs/src/guide/z.md#a (no such file)",
            "docs/src/guide/a.md: c.md (no such file)",
            "docs/src/guide/a.md: b.md#nope (no heading #nope)",
            "docs/src/guide/a.md: ../../../README.md (outside the book)",
            "docs/src/guide/a.md: #not-a-heading (no heading #not-a-heading)",
        ]
    );
}

/// The README is a front page: at most 12 KiB, with the two set-up commands as code blocks of
/// their own (CI runs the second).
#[test]
fn the_readme_stays_a_front_page() {
    let readme = read("README.md");
    assert!(
        readme.len() <= 12 * 1024,
        "README.md has {} bytes; the book is the place for more",
        readme.len()
    );
    for block in ["```\nscripts/run.sh\n```", "```\nscripts/test.sh\n```"] {
        assert!(
            readme.contains(block),
            "README.md lacks the code block {block:?}"
        );
    }
}
