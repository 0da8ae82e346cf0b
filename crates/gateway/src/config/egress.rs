//! The LLM egress (the book's "LLM egress"): the gateway holds the provider's key and kernels
//! reach the provider through it (`--llm-upstream`); how many requests it forwards at once; the
//! trust roots of the upstream; an optional per-user token budget over a window.

use std::path::PathBuf;
use std::time::Duration;

use super::layers::{Layers, Number, Opt, Text};

/// The egress options, when `--llm-upstream` turns it on.
#[derive(Clone, PartialEq, Eq)]
pub struct Egress {
    /// The provider's base URL, as `IAC_CODE_BASE_URL` would name it (`https://`, or `http://`
    /// to a loopback address); a kernel's request path is appended to it.
    pub upstream: url::Url,
    /// The CA certificates (PEM) the upstream's certificate must chain to [default: the
    /// system's and Mozilla's roots].
    pub ca: Option<PathBuf>,
    /// The operator's key: `IAC_CODE_AGUI_LLM_API_KEY`, YAML `llm_api_key`, else the
    /// gateway's `IAC_CODE_API_KEY` (which then no kernel gets). None: requests go upstream
    /// without a key of the operator's (a per-request key, or a keyless local server).
    pub key: Option<String>,
    /// The key is the YAML file's (which shared kernels, running as the gateway's uid, can read).
    pub key_in_file: bool,
    /// The most requests forwarded at once (the others wait their turn, a while).
    pub max_requests: usize,
    /// Tokens a user may spend in a window, when limited.
    pub budget: Option<Budget>,
}

/// A per-user token budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Input and output tokens together.
    pub tokens: u64,
    /// Over the last this long.
    pub window: Duration,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("upstream", &self.upstream.as_str())
            .field("ca", &self.ca)
            .field("key", &self.key.as_ref().map(|_| "<hidden>"))
            .field("key_in_file", &self.key_in_file)
            .field("max_requests", &self.max_requests)
            .field("budget", &self.budget)
            .finish()
    }
}

pub(super) const UPSTREAM_ERR: &str = "--llm-upstream must be an https:// URL (or http:// to a \
                                       loopback address) without credentials, query or fragment.";
pub(super) const CA_ERR: &str = "--llm-upstream-ca must be a string.";
pub(super) const KEY_ERR: &str = "llm_api_key must be a string.";
pub(super) const MAX_ERR: &str = "--llm-max-requests must be a whole number from 1 to 4096.";
pub(super) const BUDGET_ERR: &str = "--llm-token-budget must be a whole number of tokens from 1.";
pub(super) const WINDOW_ERR: &str =
    "--llm-budget-window must be a number of seconds from 60 to 2678400 (31 days).";
pub(super) const EXTERNAL: &str = "--llm-upstream needs managed kernels: an external kernel \
                                   (--a2a-url) is not started by the gateway, so it cannot be \
                                   given the egress instead of the key.";
pub(super) const NO_PROVIDER: &str = "--llm-upstream needs IAC_CODE_PROVIDER in the gateway's \
                                      environment (the kernels' provider, e.g. \"OpenAI \
                                      Compatible\" or \"DashScope\"): iac-code uses a base URL \
                                      only for the provider it is told to use.";
pub(super) const ALONE: &str = "--llm-upstream-ca, --llm-max-requests, --llm-token-budget and \
                                --llm-budget-window need --llm-upstream.";

const UPSTREAM: Opt<Text> = Opt::new("llm_upstream", UPSTREAM_ERR);
const CA: Opt<Text> = Opt::new("llm_upstream_ca", CA_ERR);
const KEY: Opt<Text> = Opt::new("llm_api_key", KEY_ERR);
const MAX: Opt<Number> = Opt::new("llm_max_requests", MAX_ERR);
const BUDGET: Opt<Number> = Opt::new("llm_token_budget", BUDGET_ERR);
const WINDOW: Opt<Number> = Opt::new("llm_budget_window", WINDOW_ERR);

/// The variable of the operator's key (never a flag).
pub const KEY_VAR: &str = "IAC_CODE_AGUI_LLM_API_KEY";

/// The flags of the egress options: upstream, CA, most requests, budget, window.
pub(super) type Flags = (
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The egress options from their layers; `external`: the kernels are `--a2a-url`s.
pub(super) fn load(l: &Layers<'_>, flags: Flags, external: bool) -> Result<Option<Egress>, String> {
    let (upstream, ca, max, budget, window) = flags;
    let upstream = l.get(&UPSTREAM, upstream)?;
    let ca = l.get(&CA, ca)?;
    let max = l.get(&MAX, max)?;
    let budget = l.get(&BUDGET, budget)?;
    let window = l.get(&WINDOW, window)?;
    let Some(upstream) = upstream else {
        if ca.is_some() || max.is_some() || budget.is_some() || window.is_some() {
            return Err(ALONE.into());
        }
        return Ok(None);
    };
    let upstream = upstream_url(&upstream)?;
    if external {
        return Err(EXTERNAL.into());
    }
    if (l.env)("IAC_CODE_PROVIDER").is_none_or(|p| p.trim().is_empty()) {
        return Err(NO_PROVIDER.into());
    }
    let in_var = (l.env)(KEY_VAR).is_some_and(|k| !k.is_empty());
    let (key, key_in_file) = match l.token(&KEY, KEY_VAR)? {
        Some(k) => (Some(k), !in_var),
        None => (
            (l.env)("IAC_CODE_API_KEY").filter(|k| !k.trim().is_empty()),
            false,
        ),
    };
    let whole = |n: f64, lo: f64, hi: f64, err: &str| {
        (n.fract() == 0.0 && (lo..=hi).contains(&n))
            .then_some(n)
            .ok_or_else(|| err.to_owned())
    };
    let max_requests = whole(max.unwrap_or(64.0), 1.0, 4096.0, MAX_ERR)? as usize;
    let window = whole(window.unwrap_or(86_400.0), 60.0, 2_678_400.0, WINDOW_ERR)?;
    let budget = budget
        .map(|b| whole(b, 1.0, 9.0e15, BUDGET_ERR))
        .transpose()?
        .map(|tokens| Budget {
            tokens: tokens as u64,
            window: Duration::from_secs(window as u64),
        });
    Ok(Some(Egress {
        upstream,
        ca: ca.map(PathBuf::from),
        key,
        key_in_file,
        max_requests,
        budget,
    }))
}

/// `--llm-upstream`: https, or http to a loopback address (a local model server); no
/// credentials (the key is given apart), query or fragment; the path ends without `/`.
fn upstream_url(text: &str) -> Result<url::Url, String> {
    let mut u = url::Url::parse(text.trim()).map_err(|_| UPSTREAM_ERR.to_owned())?;
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    };
    let scheme_ok = u.scheme() == "https" || (u.scheme() == "http" && loopback);
    if !scheme_ok
        || u.host().is_none()
        || !u.username().is_empty()
        || u.password().is_some()
        || u.query().is_some()
        || u.fragment().is_some()
    {
        return Err(UPSTREAM_ERR.into());
    }
    let path = u.path().trim_end_matches('/').to_owned();
    u.set_path(&path);
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::super::layers::YamlFile;
    use super::*;

    fn load_with(
        flags: Flags,
        yaml: Option<&str>,
        env: &[(&str, &str)],
        external: bool,
    ) -> Result<Option<Egress>, String> {
        let file = match yaml {
            Some(y) => YamlFile::parse(y).unwrap(),
            None => YamlFile::default(),
        };
        let env = |k: &str| {
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        let l = Layers {
            file: &file,
            env: &env,
        };
        load(&l, flags, external)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.into())
    }

    const PROVIDER: (&str, &str) = ("IAC_CODE_PROVIDER", "OpenAI Compatible");

    #[test]
    fn off_unless_an_upstream_is_given() {
        let none = (None, None, None, None, None);
        assert_eq!(load_with(none, None, &[PROVIDER], false), Ok(None));
        for alone in [
            (None, s("/ca.pem"), None, None, None),
            (None, None, s("3"), None, None),
            (None, None, None, s("100"), None),
            (None, None, None, None, s("3600")),
        ] {
            assert_eq!(
                load_with(alone, None, &[PROVIDER], false),
                Err(ALONE.into())
            );
        }
    }

    #[test]
    fn the_upstream_key_and_bounds_from_flags_variables_and_yaml() {
        let e = load_with(
            (s("https://llm.example/v1/"), None, None, None, None),
            None,
            &[PROVIDER, ("IAC_CODE_API_KEY", "op-key")],
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.upstream.as_str(), "https://llm.example/v1");
        assert_eq!(
            e.key.as_deref(),
            Some("op-key"),
            "the kernels' key stays here"
        );
        assert_eq!((e.max_requests, e.budget, e.ca), (64, None, None));
        let yaml = "llm_upstream: https://dashscope.aliyuncs.com/compatible-mode/v1\n\
                    llm_api_key: yaml-key\nllm_upstream_ca: /etc/ca.pem\nllm_max_requests: 8\n\
                    llm_token_budget: 50000\nllm_budget_window: 3600\n";
        let e = load_with(
            (None, None, None, None, None),
            Some(yaml),
            &[PROVIDER, ("IAC_CODE_API_KEY", "op-key")],
            false,
        )
        .unwrap()
        .unwrap();
        assert!(e.key_in_file);
        assert_eq!(
            (e.key.as_deref(), e.ca, e.max_requests, e.budget),
            (
                Some("yaml-key"),
                Some(PathBuf::from("/etc/ca.pem")),
                8,
                Some(Budget {
                    tokens: 50_000,
                    window: Duration::from_secs(3600)
                })
            )
        );
        let e = load_with(
            (s("http://127.0.0.1:11434/v1"), None, None, s("10"), None),
            Some("llm_api_key: yaml-key\n"),
            &[PROVIDER, (KEY_VAR, "var-key")],
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!(e.key.as_deref(), Some("var-key"), "the variable first");
        assert!(!e.key_in_file);
        assert_eq!(
            e.budget.map(|b| b.window),
            Some(Duration::from_secs(86_400))
        );
        let debug = format!("{e:?}");
        assert!(!debug.contains("var-key"), "{debug}");
    }

    #[test]
    fn wrong_values_are_refused_with_the_options_words() {
        let up = |u: &str| (s(u), None, None, None, None);
        for bad in [
            "http://llm.example/v1",
            "ftp://llm.example",
            "https://user:pw@llm.example/v1",
            "https://llm.example/v1?key=1",
            "https://llm.example/v1#x",
            "not a url",
            "unix:/run/llm",
        ] {
            assert_eq!(
                load_with(up(bad), None, &[PROVIDER], false),
                Err(UPSTREAM_ERR.into()),
                "{bad}"
            );
        }
        let ok = "https://llm.example/v1";
        assert_eq!(
            load_with(up(ok), None, &[PROVIDER], true),
            Err(EXTERNAL.into())
        );
        assert_eq!(load_with(up(ok), None, &[], false), Err(NO_PROVIDER.into()));
        for bad in ["0", "4097", "1.5", "x"] {
            let f = (s(ok), None, s(bad), None, None);
            assert_eq!(
                load_with(f, None, &[PROVIDER], false),
                Err(MAX_ERR.into()),
                "{bad}"
            );
        }
        for bad in ["0", "-5", "2.5"] {
            let f = (s(ok), None, None, s(bad), None);
            assert_eq!(
                load_with(f, None, &[PROVIDER], false),
                Err(BUDGET_ERR.into()),
                "{bad}"
            );
        }
        for bad in ["59", "2678401", "x"] {
            let f = (s(ok), None, None, s("5"), s(bad));
            assert_eq!(
                load_with(f, None, &[PROVIDER], false),
                Err(WINDOW_ERR.into()),
                "{bad}"
            );
        }
        assert_eq!(
            load_with(up(ok), Some("llm_api_key: 5\n"), &[PROVIDER], false),
            Err(KEY_ERR.into())
        );
    }
}
