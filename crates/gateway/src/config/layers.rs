//! Where an option's value comes from, written once for every option: first wins.
//!
//! - An option with a flag: the flag, or its environment variable, which clap reads where the
//!   flag is absent (either counts as unset when empty); else the YAML file's key; else the
//!   option's default.
//! - A token: no flag; its variable (an empty one counts as unset, as for every option, so an
//!   empty variable never silently switches a configured token off); else YAML.
//!
//! YAML values are never coerced: an option's [`Kind`] says which YAML type it takes, and any
//! other is that option's message.

use std::collections::HashMap;
use std::marker::PhantomData;

use serde_norway::{Mapping, Value as Yaml};

use super::EnvFn;

const UNREADABLE: &str = "Unable to load the AG-UI config file.";
const NOT_A_MAPPING: &str = "AG-UI config file must contain a YAML mapping.";

/// The YAML file's top-level keys, `-` read as `_`. Keys no option has are ignored. (No `Debug`:
/// it holds the tokens.)
#[derive(Default)]
pub(super) struct YamlFile(HashMap<String, Yaml>);

impl YamlFile {
    pub(super) fn read(path: &str) -> Result<YamlFile, String> {
        let text = std::fs::read_to_string(path).map_err(|_| UNREADABLE.to_owned())?;
        YamlFile::parse(&text)
    }

    pub(super) fn parse(text: &str) -> Result<YamlFile, String> {
        let unreadable = |_| UNREADABLE.to_owned();
        match serde_norway::from_str(text).map_err(unreadable)? {
            Yaml::Null => Ok(YamlFile::default()),
            Yaml::Mapping(m) => {
                // A later spelling of a key replaces an earlier one (`state-dir`, then `state_dir`).
                let m: Mapping = m
                    .into_iter()
                    .map(|(k, v)| match k {
                        Yaml::String(s) => (Yaml::String(s.replace('-', "_")), v),
                        k => (k, v),
                    })
                    .collect();
                // A key that is not a string leaves the file unreadable.
                serde_norway::from_value(Yaml::Mapping(m))
                    .map(YamlFile)
                    .map_err(unreadable)
            }
            _ => Err(NOT_A_MAPPING.to_owned()),
        }
    }

    /// The value of `key`; null counts as absent.
    pub(super) fn get(&self, key: &str) -> Option<&Yaml> {
        self.0.get(key).filter(|v| !v.is_null())
    }
}

/// A value that is not of its option's kind.
pub(super) struct Wrong;

/// What an option's value is, read from its flag and from its YAML value.
pub(super) trait Kind {
    /// What clap gives for the flag.
    type Flag;
    type Value;
    /// The flag's value; `Ok(None)` when it counts as unset.
    fn from_flag(flag: Self::Flag) -> Result<Option<Self::Value>, Wrong>;
    /// A YAML value other than null; `Ok(None)` when it counts as unset.
    fn from_yaml(value: &Yaml) -> Result<Option<Self::Value>, Wrong>;
}

/// Text: the flag as given, a YAML string; either counts as unset when blank.
pub(super) struct Text;

/// A number (seconds, bytes): the flag's text as a finite number, a YAML number.
pub(super) struct Number;

/// A whole number: the flag's text as one, a YAML integer.
pub(super) struct Integer;

/// A count or `auto`: the flag's text as a whole number or `auto`, a YAML integer or the string
/// `auto`.
pub(super) struct Count;

/// Where a page is served: `main`, `admin` or off; the flag's text (a bare flag is `main`, and
/// true/1/yes/on and false/0/no/off are taken as the variable's switches are), a YAML boolean
/// or one of those strings.
pub(super) struct Place;

/// A [`Place`]'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    Off,
    /// On the main listener.
    Main,
    /// On the admin listener (`--metrics-listen`).
    Admin,
}

fn served(text: &str) -> Result<Option<Served>, Wrong> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" => Ok(None),
        "main" | "true" | "1" | "yes" | "on" => Ok(Some(Served::Main)),
        "admin" => Ok(Some(Served::Admin)),
        "off" | "false" | "0" | "no" => Ok(Some(Served::Off)),
        _ => Err(Wrong),
    }
}

impl Kind for Place {
    type Flag = String;
    type Value = Served;
    fn from_flag(flag: String) -> Result<Option<Served>, Wrong> {
        served(&flag)
    }
    fn from_yaml(value: &Yaml) -> Result<Option<Served>, Wrong> {
        match value {
            Yaml::Bool(true) => Ok(Some(Served::Main)),
            Yaml::Bool(false) => Ok(Some(Served::Off)),
            Yaml::String(s) => served(s),
            _ => Err(Wrong),
        }
    }
}

/// A [`Count`]'s value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Counted {
    Auto,
    N(i64),
}

/// On or off: a switch flag (given as on or off), a YAML boolean.
pub(super) struct Switch;

/// A list: the flags (or the variable) and a YAML string are comma-separated, a YAML list holds
/// strings; blank entries are skipped. A flag list with no entry counts as unset.
pub(super) struct List;

fn blank(s: &str) -> bool {
    s.trim().is_empty()
}

impl Kind for Text {
    type Flag = String;
    type Value = String;
    fn from_flag(flag: String) -> Result<Option<String>, Wrong> {
        Ok(Some(flag).filter(|s| !blank(s)))
    }
    fn from_yaml(value: &Yaml) -> Result<Option<String>, Wrong> {
        match value {
            Yaml::String(s) => Ok(Some(s.clone()).filter(|s| !blank(s))),
            _ => Err(Wrong),
        }
    }
}

impl Kind for Number {
    type Flag = String;
    type Value = f64;
    fn from_flag(flag: String) -> Result<Option<f64>, Wrong> {
        if blank(&flag) {
            return Ok(None);
        }
        let n = flag.trim().parse::<f64>().map_err(|_| Wrong)?;
        n.is_finite().then_some(Some(n)).ok_or(Wrong)
    }
    fn from_yaml(value: &Yaml) -> Result<Option<f64>, Wrong> {
        match value {
            Yaml::Number(n) => n.as_f64().map(Some).ok_or(Wrong),
            _ => Err(Wrong),
        }
    }
}

impl Kind for Count {
    type Flag = String;
    type Value = Counted;
    fn from_flag(flag: String) -> Result<Option<Counted>, Wrong> {
        match flag.trim() {
            "" => Ok(None),
            "auto" => Ok(Some(Counted::Auto)),
            n => n.parse().map(|n| Some(Counted::N(n))).map_err(|_| Wrong),
        }
    }
    fn from_yaml(value: &Yaml) -> Result<Option<Counted>, Wrong> {
        match value {
            Yaml::Number(n) => n.as_i64().map(|n| Some(Counted::N(n))).ok_or(Wrong),
            Yaml::String(s) if s.trim() == "auto" => Ok(Some(Counted::Auto)),
            Yaml::String(s) if blank(s) => Ok(None),
            _ => Err(Wrong),
        }
    }
}

impl Kind for Integer {
    type Flag = String;
    type Value = i64;
    fn from_flag(flag: String) -> Result<Option<i64>, Wrong> {
        if blank(&flag) {
            return Ok(None);
        }
        flag.trim().parse().map(Some).map_err(|_| Wrong)
    }
    fn from_yaml(value: &Yaml) -> Result<Option<i64>, Wrong> {
        match value {
            Yaml::Number(n) => n.as_i64().map(Some).ok_or(Wrong),
            _ => Err(Wrong),
        }
    }
}

impl Kind for Switch {
    type Flag = bool;
    type Value = bool;
    fn from_flag(flag: bool) -> Result<Option<bool>, Wrong> {
        Ok(Some(flag))
    }
    fn from_yaml(value: &Yaml) -> Result<Option<bool>, Wrong> {
        match value {
            Yaml::Bool(b) => Ok(Some(*b)),
            _ => Err(Wrong),
        }
    }
}

fn split(s: &str) -> impl Iterator<Item = String> + '_ {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
}

impl Kind for List {
    type Flag = Vec<String>;
    type Value = Vec<String>;
    fn from_flag(flags: Vec<String>) -> Result<Option<Vec<String>>, Wrong> {
        let list: Vec<String> = flags.iter().flat_map(|f| split(f)).collect();
        Ok(Some(list).filter(|l| !l.is_empty()))
    }
    fn from_yaml(value: &Yaml) -> Result<Option<Vec<String>>, Wrong> {
        match value {
            Yaml::String(s) => Ok(Some(split(s).collect())),
            Yaml::Sequence(items) => {
                let mut out = Vec::with_capacity(items.len());
                for i in items {
                    match i {
                        Yaml::String(s) => out.extend(split(s)),
                        _ => return Err(Wrong),
                    }
                }
                Ok(Some(out))
            }
            _ => Err(Wrong),
        }
    }
}

/// An option's YAML key, the kind of its value and the message for a value not of that kind.
pub(super) struct Opt<K> {
    key: &'static str,
    err: &'static str,
    kind: PhantomData<K>,
}

impl<K> Opt<K> {
    pub(super) const fn new(key: &'static str, err: &'static str) -> Opt<K> {
        Opt {
            key,
            err,
            kind: PhantomData,
        }
    }

    pub(super) fn err(&self) -> &'static str {
        self.err
    }
}

/// The layers below the command line: the YAML file and the environment.
pub(super) struct Layers<'a> {
    pub(super) file: &'a YamlFile,
    pub(super) env: EnvFn<'a>,
}

impl Layers<'_> {
    /// An option with a flag: the flag (or the variable clap read for it) unless it counts as
    /// unset, else the YAML key.
    pub(super) fn get<K: Kind>(
        &self,
        opt: &Opt<K>,
        flag: Option<K::Flag>,
    ) -> Result<Option<K::Value>, String> {
        let wrong = |Wrong| opt.err.to_owned();
        match flag.map(K::from_flag).transpose().map_err(wrong)?.flatten() {
            Some(v) => Ok(Some(v)),
            None => match self.file.get(opt.key) {
                None => Ok(None),
                Some(v) => K::from_yaml(v).map_err(wrong),
            },
        }
    }

    /// A list whose empty flags do not hide its variable `var`, as the reference reads its one
    /// kernel URL: the
    /// flags' entries unless none, else the variable's (read again) unless it is empty, else the
    /// YAML key. A variable with no entry but blanks is kept whole, for its check to refuse.
    pub(super) fn list_or_var(
        &self,
        opt: &Opt<List>,
        var: &str,
        flags: Vec<String>,
    ) -> Result<Option<Vec<String>>, String> {
        if let Some(list) = List::from_flag(flags).map_err(|Wrong| opt.err.to_owned())? {
            return Ok(Some(list));
        }
        match (self.env)(var).filter(|v| !v.is_empty()) {
            Some(v) => {
                let list: Vec<String> = split(&v).collect();
                Ok(Some(if list.is_empty() { vec![v] } else { list }))
            }
            None => self.get(opt, None),
        }
    }

    /// A token: its variable `var` unless empty, else the YAML key, a string. An empty token is
    /// none.
    pub(super) fn token(&self, opt: &Opt<Text>, var: &str) -> Result<Option<String>, String> {
        let token = match (self.env)(var).filter(|v| !v.is_empty()) {
            Some(v) => v,
            None => match self.file.get(opt.key) {
                None => return Ok(None),
                Some(Yaml::String(s)) => s.clone(),
                Some(_) => return Err(opt.err.to_owned()),
            },
        };
        Ok(Some(token).filter(|t| !t.is_empty()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ERR: &str = "wrong";

    fn file(text: &str) -> YamlFile {
        YamlFile::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn with<T>(
        yaml: &str,
        env: &[(&str, &str)],
        f: impl FnOnce(&Layers<'_>) -> Result<T, String>,
    ) -> Result<T, String> {
        let file = file(yaml);
        let env = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        };
        f(&Layers {
            file: &file,
            env: &env,
        })
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_owned())
    }

    #[test]
    fn the_flag_beats_yaml_which_beats_the_default() {
        let get = |yaml: &str, flag: Option<String>| {
            with(yaml, &[], |l| {
                l.get(&Opt::<Integer>::new("port", ERR), flag)
            })
        };
        assert_eq!(get("port: 2\n", s("1")), Ok(Some(1)));
        assert_eq!(get("port: 2\n", None), Ok(Some(2)));
        assert_eq!(get("other: 2\n", None), Ok(None));
        assert_eq!(get("", None), Ok(None));
        // A wrong YAML value behind a given flag is never read.
        assert_eq!(get("port: x\n", s("1")), Ok(Some(1)));
    }

    #[test]
    fn empty_values_count_as_unset() {
        let text = |yaml: &str, flag: Option<String>| {
            with(yaml, &[], |l| l.get(&Opt::<Text>::new("host", ERR), flag))
        };
        assert_eq!(text("host: h\n", s("")), Ok(s("h")));
        assert_eq!(text("host: h\n", s("  ")), Ok(s("h")));
        assert_eq!(text("host: \" \"\n", None), Ok(None));
        assert_eq!(text("host: ~\n", None), Ok(None));
        assert_eq!(text("host:\n", None), Ok(None));
        // The flag's text is kept as given.
        assert_eq!(text("", s(" h ")), Ok(s(" h ")));
        let number = |flag: &str| {
            with("n: 3\n", &[], |l| {
                l.get(&Opt::<Number>::new("n", ERR), s(flag))
            })
        };
        assert_eq!(number(" "), Ok(Some(3.0)));
        assert_eq!(number(" 2.5 "), Ok(Some(2.5)));
        let list = |flags: &[&str]| {
            let flags = flags.iter().map(|f| f.to_string()).collect();
            with("l: [y]\n", &[], |l| {
                l.get(&Opt::<List>::new("l", ERR), Some(flags))
            })
        };
        assert_eq!(list(&[]), Ok(Some(vec!["y".to_owned()])));
        assert_eq!(list(&[" , "]), Ok(Some(vec!["y".to_owned()])));
        assert_eq!(
            list(&["a,b", " c "]),
            Ok(Some(vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]))
        );
    }

    #[test]
    fn yaml_values_are_not_coerced() {
        let refused = |yaml: &str, read: fn(&Layers<'_>) -> Result<(), String>| {
            assert_eq!(with(yaml, &[], read), Err(ERR.to_owned()), "{yaml}");
        };
        let integer = |l: &Layers<'_>| l.get(&Opt::<Integer>::new("k", ERR), None).map(drop);
        let number = |l: &Layers<'_>| l.get(&Opt::<Number>::new("k", ERR), None).map(drop);
        let text = |l: &Layers<'_>| l.get(&Opt::<Text>::new("k", ERR), None).map(drop);
        let switch = |l: &Layers<'_>| l.get(&Opt::<Switch>::new("k", ERR), None).map(drop);
        let list = |l: &Layers<'_>| l.get(&Opt::<List>::new("k", ERR), None).map(drop);
        for yaml in ["k: \"8000\"\n", "k: 8000.0\n", "k: true\n", "k: !t 8000\n"] {
            refused(yaml, integer);
        }
        for yaml in ["k: \"1.5\"\n", "k: [1]\n"] {
            refused(yaml, number);
        }
        for yaml in ["k: 5\n", "k: false\n", "k: [a]\n"] {
            refused(yaml, text);
        }
        for yaml in ["k: yes\n", "k: \"true\"\n", "k: 1\n"] {
            refused(yaml, switch);
        }
        for yaml in ["k: 5\n", "k: [a, 1]\n", "k: {a: b}\n"] {
            refused(yaml, list);
        }
        // The flag's text is read as the kind, refused when it is not one.
        for flag in ["x", "inf", "NaN"] {
            assert_eq!(
                with("", &[], |l| l.get(&Opt::<Number>::new("k", ERR), s(flag))),
                Err(ERR.to_owned())
            );
        }
        assert_eq!(
            with("", &[], |l| l.get(&Opt::<Integer>::new("k", ERR), s("1.5"))),
            Err(ERR.to_owned())
        );
        assert_eq!(
            with("k: 1e3\n", &[], |l| l
                .get(&Opt::<Number>::new("k", ERR), None)),
            Ok(Some(1000.0))
        );
    }

    #[test]
    fn switches_given_either_way_hide_yaml() {
        let get = |flag: Option<bool>| {
            with("d: true\n", &[], |l| {
                l.get(&Opt::<Switch>::new("d", ERR), flag)
            })
        };
        assert_eq!(get(None), Ok(Some(true)));
        assert_eq!(get(Some(false)), Ok(Some(false)));
        assert_eq!(
            with("d: 1\n", &[], |l| l
                .get(&Opt::<Switch>::new("d", ERR), Some(true))),
            Ok(Some(true))
        );
    }

    #[test]
    fn an_empty_flag_does_not_hide_the_variable_read_again() {
        let get = |flags: &[&str], env: &[(&str, &str)]| {
            let flags = flags.iter().map(|f| f.to_string()).collect();
            with("u: y\n", env, |l| {
                l.list_or_var(&Opt::new("u", ERR), "V", flags)
            })
        };
        let list = |l: &[&str]| Ok(Some(l.iter().map(|e| e.to_string()).collect::<Vec<_>>()));
        assert_eq!(get(&["f"], &[("V", "v")]), list(&["f"]));
        assert_eq!(get(&["f", "g,h"], &[("V", "v")]), list(&["f", "g", "h"]));
        assert_eq!(get(&[" "], &[("V", "v")]), list(&["v"]));
        assert_eq!(get(&[], &[("V", "v, w")]), list(&["v", "w"]));
        assert_eq!(get(&[""], &[("V", "")]), list(&["y"]));
        // Only an empty variable is unset here: a blank one is kept, for its check to refuse.
        assert_eq!(get(&[], &[("V", " ")]), list(&[" "]));
        assert_eq!(get(&[], &[("V", " , ")]), list(&[" , "]));
        assert_eq!(
            with("u: 1\n", &[], |l| l.list_or_var(
                &Opt::new("u", ERR),
                "V",
                Vec::new()
            )),
            Err(ERR.to_owned())
        );
        assert_eq!(
            with("u: [a, b]\n", &[], |l| l.list_or_var(
                &Opt::new("u", ERR),
                "V",
                Vec::new()
            )),
            list(&["a", "b"])
        );
    }

    #[test]
    fn a_token_is_its_variable_unless_empty_else_yaml() {
        let get = |yaml: &str, env: &[(&str, &str)]| {
            with(yaml, env, |l| l.token(&Opt::new("t", ERR), "T"))
        };
        assert_eq!(get("t: y\n", &[("T", "e")]), Ok(s("e")));
        // An empty variable counts as unset: it does not switch the YAML token off.
        assert_eq!(get("t: y\n", &[("T", "")]), Ok(s("y")));
        assert_eq!(get("", &[("T", "")]), Ok(None));
        assert_eq!(get("t: y\n", &[]), Ok(s("y")));
        assert_eq!(get("t: \"\"\n", &[]), Ok(None));
        assert_eq!(get("", &[]), Ok(None));
        assert_eq!(get("t: 5\n", &[]), Err(ERR.to_owned()));
        // A variable hides a wrong YAML value.
        assert_eq!(get("t: 5\n", &[("T", "e")]), Ok(s("e")));
    }

    #[test]
    fn the_file_is_a_mapping_with_dashes_read_as_underscores() {
        let f = file("state-dir: a\nother: [1, {x: y}]\n");
        assert_eq!(f.get("state_dir"), Some(&Yaml::String("a".into())));
        assert_eq!(
            file("state-dir: a\nstate_dir: b\n").get("state_dir"),
            Some(&Yaml::String("b".into()))
        );
        assert!(file("").0.is_empty());
        assert!(file("# nothing\n").0.is_empty());
        assert!(file("~\n").0.is_empty());
        for (text, err) in [
            ("[1, 2]\n", NOT_A_MAPPING),
            ("hello\n", NOT_A_MAPPING),
            ("a: 1\na: 2\n", UNREADABLE),
            ("a: 1\n---\nb: 2\n", UNREADABLE),
            ("a: [\n", UNREADABLE),
            ("0: h\n", UNREADABLE),
            ("? [1]\n: 2\n", UNREADABLE),
        ] {
            assert_eq!(
                YamlFile::parse(text).err().as_deref(),
                Some(err),
                "{text:?}"
            );
        }
    }
}
