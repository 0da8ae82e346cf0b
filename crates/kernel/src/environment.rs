//! What of the gateway's environment the managed kernel gets: an allow-list, never the whole.
//!
//! The kernel runs an agent whose tools read their environment; the gateway's holds its own
//! secrets (its token, the state URL with its password, the external kernel's token, the trace
//! exporter's headers). The kernel gets what `iac-code` reads (its `IAC_CODE_*` settings but the
//! gateway's `IAC_CODE_AGUI_*`, its `IACCODE_A2A_*` server settings), what a process needs to run
//! (path, home, user, locale, temporary directory, proxies, CA bundles, Python's own), and the
//! variables an operator names (`--kernel-env`). The gateway's own `IAC_CODE_AGUI_*` never pass,
//! even named (the configuration refuses such a name).

use std::collections::BTreeSet;

/// The environment snapshot taken at start-up, shared by whatever reads variables later.
pub type Env = std::sync::Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Environment lookup (injected so tests never mutate the process environment).
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The gateway's own variables: never the kernel's.
pub const GATEWAY_PREFIX: &str = "IAC_CODE_AGUI_";

/// Set by the launch itself (the kernel's token is the gateway's to choose).
const LAUNCH_OWN: &[&str] = &["IACCODE_A2A_HTTP_TOKEN"];

/// Single variables a process (Python, its HTTP clients, the agent's tools) runs with.
const NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TMPDIR",
    "TEMP",
    "TMP",
    "LANG",
    "LANGUAGE",
    "TZ",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUTF8",
    "PYTHONIOENCODING",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PYTHONPYCACHEPREFIX",
    "PYTHONWARNINGS",
    "LD_LIBRARY_PATH",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    // iac-code's telemetry opt-out and its tokenizer's cache.
    "DISABLE_TELEMETRY",
    "TIKTOKEN_CACHE_DIR",
    "TERM",
];

/// Families of variables the kernel reads: iac-code's settings, its A2A server's, the locale.
const PREFIXES: &[&str] = &["IAC_CODE_", "IACCODE_A2A_", "LC_"];

/// Whether `name` passes to the kernel without being named by the operator.
pub fn allowed(name: &str) -> bool {
    if name.starts_with(GATEWAY_PREFIX) || LAUNCH_OWN.contains(&name) {
        return false;
    }
    NAMES.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Whether an operator may name `name` in `--kernel-env`: any variable but the gateway's own.
pub fn passable(name: &str) -> bool {
    !name.starts_with(GATEWAY_PREFIX)
}

/// The kernel's environment: of `names` (the gateway's variables) and the allow-list's single
/// names, those allowed or named in `passthrough`, with their values in `env`; sorted by name.
pub fn of(
    names: impl IntoIterator<Item = String>,
    env: EnvFn<'_>,
    passthrough: &[String],
) -> Vec<(String, String)> {
    let candidates: BTreeSet<String> = names
        .into_iter()
        .chain(NAMES.iter().map(|n| (*n).to_owned()))
        .chain(passthrough.iter().cloned())
        .collect();
    candidates
        .into_iter()
        .filter(|n| allowed(n) || (passable(n) && passthrough.contains(n)))
        .filter_map(|n| env(&n).map(|v| (n, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gateway's environment: its secrets and what a kernel needs.
    const GATEWAY: &[(&str, &str)] = &[
        ("IAC_CODE_AGUI_AUTH_TOKEN", "gw-token"),
        ("IAC_CODE_AGUI_STATE_URL", "postgres://u:pw@db/x"),
        ("IAC_CODE_AGUI_A2A_TOKEN", "ext-token"),
        ("IAC_CODE_AGUI_ALLOWED_CWDS", "/ws"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=secret"),
        ("AWS_SECRET_ACCESS_KEY", "aws"),
        ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ak"),
        ("IACCODE_A2A_HTTP_TOKEN", "stale"),
        ("IAC_CODE_API_KEY", "llm-key"),
        ("IAC_CODE_PROVIDER", "OpenAI Compatible"),
        ("IACCODE_A2A_ALLOWED_CWDS", "/ws"),
        ("PATH", "/usr/bin"),
        ("HOME", "/home/op"),
        ("LC_ALL", "C.UTF-8"),
        ("https_proxy", "http://proxy:3128"),
        ("PYTHONPATH", "/opt/lib"),
    ];

    fn env(k: &str) -> Option<String> {
        GATEWAY
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    }

    fn names() -> Vec<String> {
        GATEWAY.iter().map(|(n, _)| (*n).to_owned()).collect()
    }

    fn kernel(passthrough: &[&str]) -> Vec<String> {
        let p: Vec<String> = passthrough.iter().map(|s| (*s).to_owned()).collect();
        of(names(), &env, &p).into_iter().map(|(n, _)| n).collect()
    }

    #[test]
    fn the_kernel_gets_what_iac_code_reads_and_what_a_process_needs() {
        assert_eq!(
            kernel(&[]),
            [
                "HOME",
                "IACCODE_A2A_ALLOWED_CWDS",
                "IAC_CODE_API_KEY",
                "IAC_CODE_PROVIDER",
                "LC_ALL",
                "PATH",
                "PYTHONPATH",
                "https_proxy"
            ]
        );
        let vars = of(names(), &env, &[]);
        assert!(vars.contains(&("IAC_CODE_API_KEY".into(), "llm-key".into())));
    }

    #[test]
    fn named_variables_pass_but_never_the_gateways_own() {
        let k = kernel(&[
            "ALIBABA_CLOUD_ACCESS_KEY_ID",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "IAC_CODE_AGUI_AUTH_TOKEN",
            "UNSET_ONE",
        ]);
        assert!(k.contains(&"ALIBABA_CLOUD_ACCESS_KEY_ID".to_owned()));
        // An operator's explicit choice: the kernel has an exporter of its own.
        assert!(k.contains(&"OTEL_EXPORTER_OTLP_HEADERS".to_owned()));
        assert!(!k.contains(&"IAC_CODE_AGUI_AUTH_TOKEN".to_owned()));
        assert!(!k.contains(&"UNSET_ONE".to_owned()));
        // A single name of the list is looked up even when the names given miss it.
        let only_home = of(Vec::new(), &env, &[]);
        assert!(only_home.contains(&("HOME".into(), "/home/op".into())));
    }

    #[test]
    fn the_rules_one_name_at_a_time() {
        for yes in [
            "IAC_CODE_MODEL",
            "IAC_CODE_CONFIG_DIR",
            "IAC_CODE_BASE_URL",
            "IACCODE_A2A_ALLOWED_CWDS",
            "LC_MESSAGES",
            "LANG",
            "NO_PROXY",
            "SSL_CERT_FILE",
            "VIRTUAL_ENV",
            "DISABLE_TELEMETRY",
        ] {
            assert!(allowed(yes), "{yes}");
        }
        for no in [
            "IAC_CODE_AGUI_AUTH_TOKEN",
            "IAC_CODE_AGUI_STATE_URL",
            "IAC_CODE_AGUI_A2A_TOKEN",
            "IAC_CODE_AGUI_KERNEL_ENV",
            "IACCODE_A2A_HTTP_TOKEN",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "AWS_SECRET_ACCESS_KEY",
            "IAC_CODE",
            "PYTHONSTARTUP",
            "",
        ] {
            assert!(!allowed(no), "{no}");
        }
        assert!(passable("ALIBABA_CLOUD_ACCESS_KEY_SECRET"));
        assert!(!passable("IAC_CODE_AGUI_STATE_URL"));
    }
}
