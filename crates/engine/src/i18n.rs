//! User-facing languages and the message catalogue.
//!
//! Seven languages (en, zh, es, fr, de, ja, pt). The catalogue is the reference's
//! (`i18n/messages.json`) plus the gateway's own additions (`i18n/extra.json`). Messages are keyed
//! by their English text; a text not in the catalogue (e.g. one supplied by the kernel) is passed
//! through verbatim.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value;

/// A supported language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lang {
    En,
    Zh,
    Es,
    Fr,
    De,
    Ja,
    Pt,
}

impl Lang {
    pub const ALL: [Lang; 7] = [
        Lang::En,
        Lang::Zh,
        Lang::Es,
        Lang::Fr,
        Lang::De,
        Lang::Ja,
        Lang::Pt,
    ];

    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Zh => "zh",
            Lang::Es => "es",
            Lang::Fr => "fr",
            Lang::De => "de",
            Lang::Ja => "ja",
            Lang::Pt => "pt",
        }
    }

    fn from_code(code: &str) -> Option<Lang> {
        Lang::ALL.into_iter().find(|l| l.code() == code)
    }

    /// Normalises a language tag: trim, lower-case, `_` → `-`, keep the part before the first `-`.
    pub fn from_tag(tag: &str) -> Option<Lang> {
        let t = tag.trim().to_ascii_lowercase().replace('_', "-");
        let primary = t.split('-').next().unwrap_or("");
        Lang::from_code(primary)
    }

    /// The server fallback language: the first of `LANGUAGE`, `LC_ALL`, `LC_MESSAGES`, `LANG` that is
    /// non-empty and whose prefix (before `_`, then before `.`) is supported; else English.
    pub fn server_fallback(get: impl Fn(&str) -> Option<String>) -> Lang {
        for var in ["LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"] {
            let Some(v) = get(var).filter(|v| !v.is_empty()) else {
                continue;
            };
            let prefix = v.split('_').next().unwrap_or("");
            let prefix = prefix.split('.').next().unwrap_or("").to_ascii_lowercase();
            if let Some(l) = Lang::from_code(&prefix) {
                return l;
            }
        }
        Lang::En
    }

    /// Negotiates `Accept-Language` (q-values; `*` means the server fallback; ties → earliest).
    pub fn from_accept_language(header: Option<&str>, fallback: Lang) -> Lang {
        let Some(header) = header else {
            return fallback;
        };
        let mut best: Option<(f64, Lang)> = None;
        for item in header.split(',') {
            let mut parts = item.split(';');
            let tag = parts.next().unwrap_or("").trim();
            let mut q = 1.0f64;
            for param in parts {
                let (name, value) = match param.split_once('=') {
                    Some((n, v)) => (n, v),
                    None => (param, ""),
                };
                if name.trim().eq_ignore_ascii_case("q") {
                    q = value.trim().parse::<f64>().unwrap_or(0.0);
                    break;
                }
            }
            if !q.is_finite() || q <= 0.0 || q > 1.0 {
                continue;
            }
            let lang = if tag == "*" {
                Some(fallback)
            } else {
                Lang::from_tag(tag)
            };
            let Some(lang) = lang else { continue };
            if best.is_none_or(|(bq, _)| q > bq) {
                best = Some((q, lang));
            }
        }
        best.map(|(_, l)| l).unwrap_or(fallback)
    }
}

struct Catalog {
    /// English text → translations in `Lang::ALL[1..]` order.
    entries: HashMap<String, [String; 6]>,
}

fn load(json: &str, into: &mut HashMap<String, [String; 6]>) {
    let v: Value = serde_json::from_str(json).expect("catalogue is JSON");
    let groups = v["groups"].as_object().expect("catalogue groups");
    for group in groups.values() {
        for (english, tr) in group.as_object().expect("group object") {
            let get = |code: &str| {
                tr.get(code)
                    .and_then(Value::as_str)
                    .unwrap_or(english)
                    .to_owned()
            };
            into.insert(
                english.clone(),
                [
                    get("zh"),
                    get("es"),
                    get("fr"),
                    get("de"),
                    get("ja"),
                    get("pt"),
                ],
            );
        }
    }
}

fn catalog() -> &'static Catalog {
    static CAT: OnceLock<Catalog> = OnceLock::new();
    CAT.get_or_init(|| {
        let mut entries = HashMap::new();
        load(include_str!("../i18n/messages.json"), &mut entries);
        load(include_str!("../i18n/extra.json"), &mut entries);
        Catalog { entries }
    })
}

/// Translates an English catalogue text; unknown texts are returned unchanged.
pub fn tr(lang: Lang, english: &str) -> String {
    if lang == Lang::En {
        return english.to_owned();
    }
    match catalog().entries.get(english) {
        Some(t) => {
            let idx = Lang::ALL
                .iter()
                .position(|l| *l == lang)
                .expect("lang in ALL")
                - 1;
            t[idx].clone()
        }
        None => english.to_owned(),
    }
}

/// True when the catalogue knows this English text.
pub fn is_known(english: &str) -> bool {
    catalog().entries.contains_key(english)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_normalise() {
        assert_eq!(Lang::from_tag(" zh_CN "), Some(Lang::Zh));
        assert_eq!(Lang::from_tag("PT-br"), Some(Lang::Pt));
        assert_eq!(Lang::from_tag("xx"), None);
    }

    #[test]
    fn accept_language_q_values() {
        let f = Lang::En;
        assert_eq!(
            Lang::from_accept_language(Some("zh-CN,en;q=0.5"), f),
            Lang::Zh
        );
        assert_eq!(
            Lang::from_accept_language(Some("es;q=0.9, pt;q=0.95"), f),
            Lang::Pt
        );
        assert_eq!(Lang::from_accept_language(Some("xx, de;q=0"), f), Lang::En);
        assert_eq!(
            Lang::from_accept_language(Some("*;q=0.5, zh;q=0.4"), Lang::En),
            Lang::En
        );
        assert_eq!(
            Lang::from_accept_language(Some("de;q=abc, fr"), f),
            Lang::Fr
        );
        assert_eq!(
            Lang::from_accept_language(Some("fr;q=0.8, de;q=0.8"), f),
            Lang::Fr
        );
        assert_eq!(Lang::from_accept_language(None, Lang::De), Lang::De);
    }

    #[test]
    fn server_fallback_reads_locale_vars_in_order() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            Lang::server_fallback(env(&[("LANG", "de_DE.UTF-8")])),
            Lang::De
        );
        assert_eq!(
            Lang::server_fallback(env(&[("LANGUAGE", "xx"), ("LANG", "ja_JP.UTF-8")])),
            Lang::Ja
        );
        assert_eq!(Lang::server_fallback(env(&[("LANG", "C")])), Lang::En);
    }

    /// Every entry of both catalogue files has a non-empty text in every language: the
    /// loader's fallback to English must never be what a user sees.
    #[test]
    fn every_catalogue_entry_has_every_language() {
        let mut entries = 0;
        for file in [
            include_str!("../i18n/messages.json"),
            include_str!("../i18n/extra.json"),
        ] {
            let v: Value = serde_json::from_str(file).unwrap();
            for group in v["groups"].as_object().unwrap().values() {
                for (english, tr) in group.as_object().unwrap() {
                    entries += 1;
                    for l in &Lang::ALL[1..] {
                        let text = tr.get(l.code()).and_then(Value::as_str);
                        assert!(
                            text.is_some_and(|t| !t.trim().is_empty()),
                            "{english:?} has no {} text",
                            l.code()
                        );
                    }
                }
            }
        }
        assert!(entries > 50, "{entries} entries");
        assert_eq!(
            tr(Lang::Zh, "A valid bearer token is required."),
            "需要有效的 Bearer Token。"
        );
        assert_eq!(tr(Lang::Fr, "not in catalogue"), "not in catalogue");
    }
}
