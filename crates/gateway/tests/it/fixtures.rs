//! The harness behind `tests/data/reference-state/` reproduces those files.
//!
//! `scripts/record-reference-state.sh` records the Python adapter's thread files (`iac-code
//! agui` in front of the real kernel and a scripted fake LLM, offline). The real-kernel test here
//! runs it, as a refresh of the fixtures runs it, into a temporary directory and holds what it
//! writes to the committed files: the same names, none missing and none extra; each file written
//! the adapter's way (2-space indent, keys and sets sorted, trailing newline); and each equal to
//! the committed one once what differs from one recording to the next is replaced by
//! placeholders:
//!
//! - generated ids: UUIDs (execution, task and session ids), permission interrupt ids
//!   (`permission-<32 hex>`) and the fake LLM's tool call ids (`call_<12 hex>`, also inside
//!   `ask-call_…` and `safeSummary`), numbered in order of appearance across a thread's files, so
//!   an id must recur exactly where the committed one does (an execution id in
//!   `terminalExecutionIds`, a task id as `requestTaskId`);
//! - the run digests: a run's digest hashes its whole request, so the temporary workspace path in
//!   its `cwd` and the interrupt ids it answers. They are numbered the same way (a run keeps its
//!   digest from one moment to the next, two runs never share one), and each digest the harness
//!   produced must be that of a request it sent.
//!
//! Everything else must be equal: context ids, `cwd` (the harness names the fixtures' workspace
//! root in it), user ids, pipeline positions and open steps, text snapshot digests, applied
//! resume digests, pending interrupt values, which runs are recorded. The fast-tier tests below
//! show the comparison catching what it is there for.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

/// `<scenario>_<moment>.<threadId>.json` → its bytes.
type Files = BTreeMap<String, Vec<u8>>;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn committed_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reference-state")
}

fn read_files(dir: &Path) -> Files {
    let mut files = Files::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            files.insert(name, std::fs::read(e.path()).unwrap());
        }
    }
    files
}

/// The thread id a file name ends with.
fn thread_of(name: &str) -> &str {
    let stem = name.strip_suffix(".json").unwrap_or(name);
    stem.rsplit_once('.').map_or(stem, |(_, t)| t)
}

// ---- the adapter's way of writing a thread file ------------------------------------------------

/// `v` with every object's keys sorted.
fn sorted(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

/// `json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False)` and a newline.
fn adapter_bytes(v: &Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(&sorted(v)).unwrap();
    s.push('\n');
    s.into_bytes()
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The lists the adapter writes sorted: terminal execution ids, text snapshot digests and open
/// pipeline steps by value, applied resume digests by (executionId, interruptId).
fn sort_sets(doc: &mut Value) {
    if let Some(a) = doc
        .get_mut("terminalExecutionIds")
        .and_then(Value::as_array_mut)
    {
        a.sort_by(|x, y| x.as_str().cmp(&y.as_str()));
    }
    if let Some(a) = doc
        .get_mut("appliedResumeDigests")
        .and_then(Value::as_array_mut)
    {
        a.sort_by(|x, y| {
            (str_at(x, "executionId"), str_at(x, "interruptId"))
                .cmp(&(str_at(y, "executionId"), str_at(y, "interruptId")))
        });
    }
    if let Some(ex) = doc.get_mut("execution") {
        for key in ["textSnapshotDigests", "pipelineOpenSteps"] {
            if let Some(a) = ex.get_mut(key).and_then(Value::as_array_mut) {
                a.sort_by(|x, y| x.as_str().cmp(&y.as_str()));
            }
        }
    }
}

// ---- what differs from one recording to the next --------------------------------------------

fn is_hex(b: &[u8]) -> bool {
    b.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The generated id starting at `s[i..]`, if any: its class and length.
fn volatile_at(s: &[u8], i: usize) -> Option<(&'static str, usize)> {
    let rest = &s[i..];
    if rest.len() >= 36
        && [8, 13, 18, 23].iter().all(|&d| rest[d] == b'-')
        && [0..8, 9..13, 14..18, 19..23, 24..36]
            .into_iter()
            .all(|r| is_hex(&rest[r]))
        && !rest.get(36).is_some_and(|c| c.is_ascii_hexdigit())
    {
        return Some(("uuid", 36));
    }
    for (prefix, hex, class) in [("permission-", 32, "permission"), ("call_", 12, "call")] {
        let n = prefix.len() + hex;
        if rest.starts_with(prefix.as_bytes())
            && rest.len() >= n
            && is_hex(&rest[prefix.len()..n])
            && !rest.get(n).is_some_and(|c| c.is_ascii_hexdigit())
        {
            return Some((class, n));
        }
    }
    None
}

/// Placeholders for one side's volatile values, shared by the files of one thread.
#[derive(Default)]
struct Names {
    by_value: HashMap<String, String>,
    count: HashMap<&'static str, usize>,
}

impl Names {
    fn name(&mut self, class: &'static str, value: &str) -> String {
        if let Some(n) = self.by_value.get(value) {
            return n.clone();
        }
        let c = self.count.entry(class).or_default();
        *c += 1;
        let n = format!("<{class}-{c}>");
        self.by_value.insert(value.to_owned(), n.clone());
        n
    }

    fn text(&mut self, s: &str) -> String {
        let b = s.as_bytes();
        let (mut out, mut i, mut from) = (String::new(), 0, 0);
        while i < b.len() {
            // Ids are ASCII, so a match starts and ends on character boundaries.
            if let Some((class, len)) = volatile_at(b, i) {
                out.push_str(&s[from..i]);
                out.push_str(&self.name(class, &s[i..i + len]));
                i += len;
                from = i;
            } else {
                i += 1;
            }
        }
        out.push_str(&s[from..]);
        out
    }

    fn value(&mut self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.value(x)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (self.text(k), self.value(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// A thread file with its volatile values replaced by placeholders. The sorted sets come last
/// (their order follows the ids, so an id is named where it first appears elsewhere), then they
/// are sorted again by placeholder.
fn normalise(doc: &Value, names: &mut Names) -> Value {
    let later = ["appliedResumeDigests", "terminalExecutionIds"];
    let Value::Object(m) = doc else {
        return names.value(doc);
    };
    let mut out = Map::new();
    let keys = m.keys().filter(|k| !later.contains(&k.as_str()));
    for k in keys.chain(m.keys().filter(|k| later.contains(&k.as_str()))) {
        let v = &m[k];
        let n = match k.as_str() {
            "runDigests" => Value::Object(
                v.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(run, d)| {
                        let d = d.as_str().unwrap_or_default();
                        (run.clone(), Value::String(names.name("run-digest", d)))
                    })
                    .collect(),
            ),
            _ => names.value(v),
        };
        out.insert(k.clone(), n);
    }
    let mut out = sorted(&Value::Object(out));
    sort_sets(&mut out);
    out
}

/// One side's files, checked for the adapter's form and normalised (a problem per file that is
/// not).
fn normalise_side(
    side: &str,
    files: &Files,
    problems: &mut Vec<String>,
) -> BTreeMap<String, Value> {
    let mut names: HashMap<String, Names> = HashMap::new();
    let mut out = BTreeMap::new();
    for (name, bytes) in files {
        let doc: Value = match serde_json::from_slice(bytes) {
            Ok(d) => d,
            Err(e) => {
                problems.push(format!("{side} {name}: not JSON: {e}"));
                continue;
            }
        };
        let mut resorted = doc.clone();
        sort_sets(&mut resorted);
        if adapter_bytes(&resorted) != *bytes {
            problems.push(format!(
                "{side} {name}: not written as the adapter writes (2-space indent, sorted keys \
                 and sets, trailing newline)"
            ));
        }
        let thread = thread_of(name);
        if str_at(&doc, "threadId") != thread {
            problems.push(format!("{side} {name}: holds thread {:?}", doc["threadId"]));
        }
        let n = normalise(&doc, names.entry(thread.to_owned()).or_default());
        out.insert(name.clone(), n);
    }
    out
}

/// First lines where two normalised documents differ.
fn diff(a: &Value, b: &Value) -> String {
    let a = serde_json::to_string_pretty(a).unwrap();
    let b = serde_json::to_string_pretty(b).unwrap();
    let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = Vec::new();
    for i in 0..al.len().max(bl.len()) {
        let (x, y) = (al.get(i).copied(), bl.get(i).copied());
        if x != y {
            out.push(format!(
                "  line {}: committed {}\n           produced  {}",
                i + 1,
                x.unwrap_or("<none>").trim(),
                y.unwrap_or("<none>").trim()
            ));
            if out.len() == 5 {
                break;
            }
        }
    }
    out.join("\n")
}

/// Holds `produced` to `committed`: every problem found, or none.
fn compare(committed: &Files, produced: &Files) -> Vec<String> {
    let mut problems = Vec::new();
    for name in committed.keys().filter(|n| !produced.contains_key(*n)) {
        problems.push(format!("{name}: committed, not produced"));
    }
    for name in produced.keys().filter(|n| !committed.contains_key(*n)) {
        problems.push(format!("{name}: produced, not committed"));
    }
    let c = normalise_side("committed", committed, &mut problems);
    let p = normalise_side("produced", produced, &mut problems);
    for (name, cv) in &c {
        if let Some(pv) = p.get(name) {
            if cv != pv {
                problems.push(format!("{name}: differs\n{}", diff(cv, pv)));
            }
        }
    }
    problems
}

/// Each run digest of the produced files is the digest of a request the harness sent (its log:
/// one JSON object a line, `threadId`, `runId`, `raw`).
fn check_digests(produced: &Files, requests: &str) -> Vec<String> {
    let mut sent: HashMap<(String, String), Vec<String>> = HashMap::new();
    for line in requests.lines().filter(|l| !l.trim().is_empty()) {
        let r: Value = serde_json::from_str(line).expect("request log line");
        let digest =
            engine::canonical::digest_bytes(str_at(&r, "raw").as_bytes()).expect("canonical");
        sent.entry((
            str_at(&r, "threadId").to_owned(),
            str_at(&r, "runId").to_owned(),
        ))
        .or_default()
        .push(digest);
    }
    let mut problems = Vec::new();
    for (name, bytes) in produced {
        let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
            continue;
        };
        let thread = str_at(&doc, "threadId").to_owned();
        for (run, d) in doc["runDigests"].as_object().into_iter().flatten() {
            let known = sent.get(&(thread.clone(), run.clone()));
            if !known.is_some_and(|k| k.iter().any(|x| Some(x.as_str()) == d.as_str())) {
                problems.push(format!(
                    "{name}: the digest of {run} is not that of a request the harness sent"
                ));
            }
        }
    }
    problems
}

// ---- the harness ------------------------------------------------------------------------------

/// Runs `scripts/record-reference-state.sh` into `out`; its stderr on failure.
fn record(out: &Path, requests: &Path, log: &Path) {
    let bin = testkit::real_kernel::kernel_bin_dir();
    let mut child = Command::new("bash")
        .arg(repo().join("scripts/record-reference-state.sh"))
        .arg(out)
        .arg("--requests")
        .arg(requests)
        .env("IAC_CODE_AGUI_KERNEL_BIN", &bin)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(log).unwrap())
        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
        .spawn()
        .expect("run scripts/record-reference-state.sh");
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            // Its servers die with it (they are started with a parent-death signal).
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stderr = std::fs::read_to_string(log.with_extension("err")).unwrap_or_default();
    match status {
        Some(s) if s.success() => eprintln!("{stderr}"),
        Some(s) => panic!("the harness failed ({s}):\n{stderr}"),
        None => panic!("the harness did not finish in 240 s:\n{stderr}"),
    }
}

#[test]
fn the_harness_reproduces_the_committed_reference_state() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("state");
    let requests = dir.path().join("requests.jsonl");
    let t0 = Instant::now();
    record(&out, &requests, &dir.path().join("harness.log"));
    eprintln!("harness: {:.1} s", t0.elapsed().as_secs_f64());
    let committed = read_files(&committed_dir());
    let produced = read_files(&out);
    assert!(!committed.is_empty(), "no committed fixtures");
    let mut problems = compare(&committed, &produced);
    problems.extend(check_digests(
        &produced,
        &std::fs::read_to_string(&requests).unwrap(),
    ));
    assert!(
        problems.is_empty(),
        "the harness does not reproduce tests/data/reference-state ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

// ---- the comparison, shown to catch what it is there for (fast tier) ------------------------

/// The committed files as another recording would write them: every generated id and run digest
/// replaced by a fresh one consistently per thread, sets sorted anew.
fn another_recording(committed: &Files) -> Files {
    let mut fresh: HashMap<(String, String), String> = HashMap::new();
    let mut renew = |thread: &str, class: &str, old: &str| -> String {
        fresh
            .entry((thread.to_owned(), old.to_owned()))
            .or_insert_with(|| {
                let u = uuid::Uuid::new_v4();
                let hex = u.simple().to_string();
                match class {
                    "uuid" => u.to_string(),
                    "permission" => format!("permission-{hex}"),
                    "call" => format!("call_{}", &hex[..12]),
                    _ => engine::canonical::sha256_hex(hex.as_bytes()),
                }
            })
            .clone()
    };
    fn walk(v: &Value, f: &mut dyn FnMut(&str) -> String) -> Value {
        match v {
            Value::String(s) => Value::String(f(s)),
            Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, f)).collect()),
            Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (f(k), walk(x, f))).collect()),
            other => other.clone(),
        }
    }
    let mut out = Files::new();
    for (name, bytes) in committed {
        let thread = thread_of(name).to_owned();
        let doc: Value = serde_json::from_slice(bytes).unwrap();
        let mut doc = walk(&doc, &mut |s: &str| {
            let b = s.as_bytes();
            let (mut o, mut i, mut from) = (String::new(), 0, 0);
            while i < b.len() {
                if let Some((class, len)) = volatile_at(b, i) {
                    o.push_str(&s[from..i]);
                    o.push_str(&renew(&thread, class, &s[i..i + len]));
                    i += len;
                    from = i;
                } else {
                    i += 1;
                }
            }
            o.push_str(&s[from..]);
            o
        });
        if let Some(m) = doc["runDigests"].as_object_mut() {
            for d in m.values_mut() {
                *d = Value::String(renew(&thread, "run-digest", d.as_str().unwrap()));
            }
        }
        sort_sets(&mut doc);
        out.insert(name.clone(), adapter_bytes(&doc));
    }
    out
}

fn edit(files: &Files, name: &str, f: impl FnOnce(&mut Value)) -> Files {
    let mut files = files.clone();
    let mut doc: Value = serde_json::from_slice(&files[name]).unwrap();
    f(&mut doc);
    sort_sets(&mut doc);
    files.insert(name.to_owned(), adapter_bytes(&doc));
    files
}

#[test]
fn the_committed_files_are_written_as_the_adapter_writes_them() {
    let committed = read_files(&committed_dir());
    assert!(committed.len() >= 29, "{:?}", committed.keys());
    assert_eq!(compare(&committed, &committed), Vec::<String>::new());
}

#[test]
fn another_recording_matches_and_every_alteration_is_noticed() {
    let committed = read_files(&committed_dir());
    let other = another_recording(&committed);
    assert_ne!(other, committed);
    assert_eq!(compare(&committed, &other), Vec::<String>::new());

    let fails = |what: &str, files: Files, expect: &str| {
        let problems = compare(&committed, &files);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "{what}: not noticed ({problems:?})"
        );
    };
    let s10 = "S10_after_resume.thread-p1.json";
    let s16 = "S16_after_resume2.thread-s16.json";
    let s08 = "S08_after_error_resumes.thread-s8r.json";
    let s03 = "S03_after_interrupt.thread-s3.json";
    fails(
        "pipeline position",
        edit(&other, s10, |d| {
            d["execution"]["pipelineSequence"] = 22.into()
        }),
        s10,
    );
    fails(
        "a text snapshot digest",
        edit(&other, s10, |d| {
            d["execution"]["textSnapshotDigests"][0] = "0".repeat(64).into()
        }),
        s10,
    );
    fails(
        "an applied resume digest",
        edit(&other, s16, |d| {
            d["appliedResumeDigests"][1]["digest"] = "1".repeat(64).into()
        }),
        s16,
    );
    fails(
        "a terminal id that is not the execution's",
        edit(&other, s10, |d| {
            d["terminalExecutionIds"][0] = uuid::Uuid::new_v4().to_string().into()
        }),
        s10,
    );
    fails(
        "a task id that is not the interrupt's",
        edit(&other, s03, |d| {
            d["execution"]["taskId"] = uuid::Uuid::new_v4().to_string().into()
        }),
        s03,
    );
    fails(
        "a pending interrupt's text",
        edit(&other, s03, |d| {
            let pending = d["execution"]["pending"].as_object_mut().unwrap();
            let value = pending.values_mut().next().unwrap();
            value["value"]["prompt"] = "Run it?".into();
        }),
        s03,
    );
    fails(
        "the user id",
        edit(&other, s10, |d| d["userId"] = "someone".into()),
        s10,
    );
    fails(
        "the context id",
        edit(&other, s10, |d| {
            d["contextId"] = "agui-0000000000000000000000000000000000000000".into()
        }),
        s10,
    );
    fails(
        "a run that was not recorded",
        edit(&other, s08, |d| {
            d["runDigests"]["run-s8r-3"] = "2".repeat(64).into();
        }),
        s08,
    );
    fails(
        "two runs with one digest",
        edit(&other, s08, |d| {
            let first = d["runDigests"]["run-s8r-4"].clone();
            d["runDigests"]["run-s8r-5"] = first;
        }),
        s08,
    );
    fails(
        "another cwd",
        edit(&other, s10, |d| d["cwd"] = "/elsewhere/ws/thread-p1".into()),
        s10,
    );
    let mut missing = other.clone();
    missing.remove(s03);
    fails("a missing file", missing, "committed, not produced");
    let mut extra = other.clone();
    extra.insert("S99_after_run.thread-s1.json".into(), other[s03].clone());
    fails("an extra file", extra, "produced, not committed");
    let mut format = other.clone();
    let doc: Value = serde_json::from_slice(&other[s03]).unwrap();
    format.insert(
        s03.into(),
        serde_json::to_string_pretty(&doc).unwrap().into_bytes(),
    );
    fails(
        "no trailing newline",
        format,
        "not written as the adapter writes",
    );
    let mut unsorted = other.clone();
    let doc: Value = serde_json::from_slice(&other[s16]).unwrap();
    let mut doc = sorted(&doc);
    doc["appliedResumeDigests"]
        .as_array_mut()
        .unwrap()
        .reverse();
    let mut bytes = serde_json::to_string_pretty(&doc).unwrap().into_bytes();
    bytes.push(b'\n');
    unsorted.insert(s16.into(), bytes);
    fails(
        "an unsorted set",
        unsorted,
        "not written as the adapter writes",
    );
}

#[test]
fn a_digest_the_harness_did_not_send_is_noticed() {
    let name = "S01_after_run.thread-s1.json";
    let raw = r#"{"threadId":"thread-s1","runId":"run-s1-1"}"#;
    let digest = engine::canonical::digest_bytes(raw.as_bytes()).unwrap();
    let log =
        serde_json::json!({"threadId": "thread-s1", "runId": "run-s1-1", "raw": raw}).to_string();
    let committed = read_files(&committed_dir());
    let files: Files = [(name.to_owned(), committed[name].clone())].into();
    let good = edit(&files, name, |d| {
        d["runDigests"]["run-s1-1"] = digest.into()
    });
    assert_eq!(check_digests(&good, &log), Vec::<String>::new());
    assert_eq!(check_digests(&files, &log).len(), 1);
}
