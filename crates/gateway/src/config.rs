//! Command line, environment and YAML configuration (D-1).
//!
//! Precedence for options with a flag: the flag (or its environment variable) > the YAML value >
//! the built-in default. Tokens come from the environment, else YAML. YAML keys may use dashes or
//! underscores. Every validation failure is a message on stderr and exit status 1.

use std::path::PathBuf;

use clap::Parser;
use serde_yaml::Value as Yaml;

use crate::i18n::Lang;
use crate::paths;

/// AG-UI gateway in front of the iac-code A2A execution kernel (drop-in for `iac-code agui`).
#[derive(Debug, Parser)]
#[command(name = "iac-code-agui", version, about, long_about = None)]
pub struct Cli {
    /// YAML configuration file (keys: host, port, a2a_url, debug, log_stdout, state_dir,
    /// idle_shutdown, auth_token, a2a_token, interrupt_ttl, a2a_command, shutdown_timeout,
    /// kernel_idle_timeout; dashes or underscores).
    #[arg(long, value_name = "PATH")]
    pub config: Option<String>,
    /// Bind address [env: IAC_CODE_AGUI_HOST] [default: 127.0.0.1].
    #[arg(long)]
    pub host: Option<String>,
    /// Bind port, 1..65535 [env: IAC_CODE_AGUI_PORT] [default: 8000].
    #[arg(long, allow_hyphen_values = true)]
    pub port: Option<String>,
    /// URL of an existing loopback A2A kernel; empty starts a managed `iac-code a2a` child
    /// [env: IAC_CODE_AGUI_A2A_URL]. Its bearer token: env IAC_CODE_AGUI_A2A_TOKEN or YAML a2a_token.
    #[arg(long)]
    pub a2a_url: Option<String>,
    /// Debug logging (default: info).
    #[arg(short, long)]
    pub debug: bool,
    /// Write logs to stdout instead of stderr.
    #[arg(long, overrides_with = "no_log_stdout")]
    pub log_stdout: bool,
    /// Write logs to stderr (default).
    #[arg(long, overrides_with = "log_stdout")]
    pub no_log_stdout: bool,
    /// Durable state root [env: IAC_CODE_AGUI_STATE_DIR] [default: <IAC_CODE_CONFIG_DIR or
    /// ~/.iac-code>/agui].
    #[arg(long)]
    pub state_dir: Option<String>,
    /// Exit after this many idle seconds (no active run, no loaded pending interrupt); 0 disables.
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub idle_shutdown: Option<String>,
    /// Interrupt time-to-live in seconds; 0 disables expiry [env: IAC_CODE_AGUI_INTERRUPT_TTL]
    /// [default: 86400].
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub interrupt_ttl: Option<String>,
    /// Command that starts the managed kernel [env: IAC_CODE_AGUI_A2A_COMMAND] [default: iac-code
    /// on PATH]. Arguments: a2a --host 127.0.0.1 --port <free> --thinking-exposure all.
    #[arg(long)]
    pub a2a_command: Option<String>,
    /// Seconds open streams get to finish after SIGTERM/SIGINT [env: IAC_CODE_AGUI_SHUTDOWN_TIMEOUT]
    /// [default: 10].
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub shutdown_timeout: Option<String>,
    /// Seconds a kernel stream may stay silent (no event, no ping) before the run fails with
    /// A2A_UNAVAILABLE and its task is cancelled; 0 waits forever
    /// [env: IAC_CODE_AGUI_KERNEL_IDLE_TIMEOUT] [default: 60].
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub kernel_idle_timeout: Option<String>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// Normalised loopback kernel URL (one trailing `/`); `None` ⇒ managed kernel.
    pub a2a_url: Option<String>,
    pub a2a_token: Option<String>,
    /// Bearer token of the gateway's own POST routes; `None` or empty ⇒ no authentication.
    pub auth_token: Option<String>,
    pub debug: bool,
    pub log_stdout: bool,
    pub state_dir: PathBuf,
    /// True when the state dir is the default one (then the config dir is created at start-up).
    pub state_dir_is_default: bool,
    pub idle_shutdown_secs: f64,
    pub interrupt_ttl_secs: u64,
    pub a2a_command: String,
    pub shutdown_timeout_secs: f64,
    /// Longest silence of a kernel stream; 0 ⇒ none.
    pub kernel_idle_timeout_secs: f64,
    /// Raw allowed-cwds list: `IAC_CODE_AGUI_ALLOWED_CWDS`, else `IACCODE_A2A_ALLOWED_CWDS`.
    pub allowed_cwds: Option<String>,
    /// `HOME` (for `~` expansion).
    pub home: Option<String>,
    /// The process working directory (a default workspace root).
    pub process_cwd: PathBuf,
    /// The temporary directory (a default workspace root).
    pub temp_dir: PathBuf,
    /// Server fallback language (from the locale variables).
    pub fallback_lang: Lang,
}

/// Environment lookup (injected so tests never mutate the process environment).
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

const LOOPBACK_ERR: &str = "The AG-UI adapter may connect only to a loopback A2A HTTP(S) URL.";

fn yaml_get<'a>(map: &'a serde_yaml::Mapping, key: &str) -> Option<&'a Yaml> {
    map.get(Yaml::String(key.to_owned()))
        .filter(|v| !v.is_null())
}

/// Loads the YAML file into a mapping with `-` in keys normalised to `_`.
fn load_yaml(path: &str) -> Result<serde_yaml::Mapping, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|_| "Unable to load the AG-UI config file.".to_owned())?;
    let v: Yaml = serde_yaml::from_str(&text)
        .map_err(|_| "Unable to load the AG-UI config file.".to_owned())?;
    fn norm(v: Yaml) -> Yaml {
        match v {
            Yaml::Mapping(m) => Yaml::Mapping(
                m.into_iter()
                    .map(|(k, v)| {
                        let k = match k {
                            Yaml::String(s) => Yaml::String(s.replace('-', "_")),
                            other => other,
                        };
                        (k, norm(v))
                    })
                    .collect(),
            ),
            Yaml::Sequence(s) => Yaml::Sequence(s.into_iter().map(norm).collect()),
            other => other,
        }
    }
    match norm(v) {
        Yaml::Null => Ok(serde_yaml::Mapping::new()),
        Yaml::Mapping(m) => Ok(m),
        _ => Err("AG-UI config file must contain a YAML mapping.".to_owned()),
    }
}

/// Validates a loopback http(s) URL and normalises it to one trailing `/`.
pub fn validate_a2a_url(url: &str) -> Result<String, String> {
    let lower = url.trim();
    let (scheme, rest) = lower.split_once("://").ok_or(LOOPBACK_ERR)?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return Err(LOOPBACK_ERR.into());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority
        .rsplit_once('@')
        .map(|(_, h)| h)
        .unwrap_or(authority);
    let host = if let Some(stripped) = hostport.strip_prefix('[') {
        stripped.split(']').next().unwrap_or("").to_owned()
    } else {
        hostport.split(':').next().unwrap_or("").to_owned()
    };
    let host = host.to_ascii_lowercase();
    if !matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1") {
        return Err(LOOPBACK_ERR.into());
    }
    Ok(format!("{}/", url.trim().trim_end_matches('/')))
}

fn parse_number(text: &str) -> Option<f64> {
    let t = text.trim();
    t.parse::<f64>().ok().filter(|f| f.is_finite())
}

impl Config {
    /// Builds the configuration from parsed arguments and an environment.
    pub fn load(cli: Cli, env: EnvFn<'_>) -> Result<Config, String> {
        let yaml = match cli.config.as_deref().filter(|c| !c.is_empty()) {
            Some(path) => load_yaml(path)?,
            None => serde_yaml::Mapping::new(),
        };
        let env_nonempty = |k: &str| env(k).filter(|v| !v.is_empty());

        // host
        let host = match cli.host.or_else(|| env_nonempty("IAC_CODE_AGUI_HOST")) {
            Some(h) => h,
            None => match yaml_get(&yaml, "host") {
                Some(Yaml::String(s)) => s.clone(),
                Some(_) => return Err("--host must be a string.".into()),
                None => "127.0.0.1".into(),
            },
        };

        // port
        let port_err = "--port must be between 1 and 65535.";
        let port: i64 = match cli.port.or_else(|| env_nonempty("IAC_CODE_AGUI_PORT")) {
            Some(p) => p.trim().parse::<i64>().map_err(|_| port_err.to_owned())?,
            None => match yaml_get(&yaml, "port") {
                Some(Yaml::Number(n)) if n.is_i64() || n.is_u64() => {
                    n.as_i64().ok_or(port_err.to_owned())?
                }
                Some(_) => return Err(port_err.into()),
                None => 8000,
            },
        };
        if !(1..=65535).contains(&port) {
            return Err(port_err.into());
        }

        // a2a url
        let a2a_url_raw = match cli.a2a_url.filter(|u| !u.is_empty()) {
            Some(u) => Some(u),
            None => match env_nonempty("IAC_CODE_AGUI_A2A_URL") {
                Some(u) => Some(u),
                None => match yaml_get(&yaml, "a2a_url") {
                    Some(Yaml::String(s)) if !s.is_empty() => Some(s.clone()),
                    Some(Yaml::String(_)) | None => None,
                    Some(_) => return Err("--a2a-url must be a string.".into()),
                },
            },
        };
        let a2a_url = a2a_url_raw.as_deref().map(validate_a2a_url).transpose()?;

        // tokens: env > config
        let token = |env_key: &str, yaml_key: &str, err: &str| -> Result<Option<String>, String> {
            if let Some(v) = env(env_key) {
                return Ok(Some(v));
            }
            match yaml_get(&yaml, yaml_key) {
                Some(Yaml::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(err.to_owned()),
                None => Ok(None),
            }
        };
        let auth_token = token(
            "IAC_CODE_AGUI_AUTH_TOKEN",
            "auth_token",
            "auth_token must be a string.",
        )?
        .filter(|t| !t.is_empty());
        let a2a_token = token(
            "IAC_CODE_AGUI_A2A_TOKEN",
            "a2a_token",
            "a2a_token must be a string.",
        )?
        .filter(|t| !t.is_empty());

        let yaml_bool = |key: &str| -> Result<bool, String> {
            match yaml_get(&yaml, key) {
                Some(Yaml::Bool(b)) => Ok(*b),
                Some(_) => Err(format!("{key} must be a boolean.")),
                None => Ok(false),
            }
        };
        let debug = cli.debug || yaml_bool("debug")?;
        let log_stdout = if cli.log_stdout {
            true
        } else if cli.no_log_stdout {
            false
        } else {
            yaml_bool("log_stdout")?
        };

        // numbers from flag/env/yaml
        let number = |flag: Option<String>,
                      env_key: Option<&str>,
                      yaml_key: &str,
                      default: f64,
                      err: &str|
         -> Result<f64, String> {
            let v = match flag.or_else(|| env_key.and_then(env_nonempty)) {
                Some(s) => parse_number(&s).ok_or_else(|| err.to_owned())?,
                None => match yaml_get(&yaml, yaml_key) {
                    Some(Yaml::Number(n)) => n.as_f64().ok_or_else(|| err.to_owned())?,
                    Some(_) => return Err(err.to_owned()),
                    None => default,
                },
            };
            if v < 0.0 || !v.is_finite() {
                return Err(err.to_owned());
            }
            Ok(v)
        };
        let idle_shutdown_secs = number(
            cli.idle_shutdown,
            None,
            "idle_shutdown",
            0.0,
            "--idle-shutdown must be a non-negative number.",
        )?;
        let ttl = number(
            cli.interrupt_ttl,
            Some("IAC_CODE_AGUI_INTERRUPT_TTL"),
            "interrupt_ttl",
            86400.0,
            "--interrupt-ttl must be a non-negative integer.",
        )?;
        if ttl.fract() != 0.0 {
            return Err("--interrupt-ttl must be a non-negative integer.".into());
        }
        let shutdown_timeout_secs = number(
            cli.shutdown_timeout,
            Some("IAC_CODE_AGUI_SHUTDOWN_TIMEOUT"),
            "shutdown_timeout",
            10.0,
            "--shutdown-timeout must be a non-negative number.",
        )?;

        let kernel_idle_timeout_secs = number(
            cli.kernel_idle_timeout,
            Some("IAC_CODE_AGUI_KERNEL_IDLE_TIMEOUT"),
            "kernel_idle_timeout",
            60.0,
            "--kernel-idle-timeout must be a non-negative number.",
        )?;

        let a2a_command = match cli
            .a2a_command
            .filter(|c| !c.is_empty())
            .or_else(|| env_nonempty("IAC_CODE_AGUI_A2A_COMMAND"))
        {
            Some(c) => c,
            None => match yaml_get(&yaml, "a2a_command") {
                Some(Yaml::String(s)) if !s.is_empty() => s.clone(),
                Some(Yaml::String(_)) | None => "iac-code".into(),
                Some(_) => return Err("--a2a-command must be a string.".into()),
            },
        };

        let home = env("HOME");
        let process_cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let expand = |raw: &str| -> PathBuf {
            let s = paths::expand_user(raw.trim(), home.as_deref());
            let s = paths::expand_vars(&s, env);
            let p = PathBuf::from(s);
            let abs = if p.is_absolute() {
                p
            } else {
                process_cwd.join(p)
            };
            paths::resolve(&abs).unwrap_or_else(|_| paths::normalize(&abs))
        };

        // state dir: flag > env > yaml > <config-dir>/agui
        let explicit = match cli.state_dir.filter(|s| !s.trim().is_empty()) {
            Some(s) => Some(s),
            None => {
                match env_nonempty("IAC_CODE_AGUI_STATE_DIR").filter(|s| !s.trim().is_empty()) {
                    Some(s) => Some(s),
                    None => match yaml_get(&yaml, "state_dir") {
                        Some(Yaml::String(s)) if !s.trim().is_empty() => Some(s.clone()),
                        Some(Yaml::String(_)) | None => None,
                        Some(_) => return Err("--state-dir must be a string.".into()),
                    },
                }
            }
        };
        let (state_dir, state_dir_is_default) = match explicit {
            Some(s) => (expand(&s), false),
            None => {
                let config_dir = match env("IAC_CODE_CONFIG_DIR").filter(|s| !s.trim().is_empty()) {
                    Some(c) => expand(&c),
                    None => expand("~/.iac-code"),
                };
                (config_dir.join("agui"), true)
            }
        };

        let allowed_cwds = env_nonempty("IAC_CODE_AGUI_ALLOWED_CWDS")
            .or_else(|| env_nonempty("IACCODE_A2A_ALLOWED_CWDS"));
        let temp_dir = ["TMPDIR", "TEMP", "TMP"]
            .iter()
            .find_map(|k| env_nonempty(k))
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"));

        Ok(Config {
            host,
            port: port as u16,
            a2a_url,
            a2a_token,
            auth_token,
            debug,
            log_stdout,
            state_dir,
            state_dir_is_default,
            idle_shutdown_secs,
            interrupt_ttl_secs: ttl as u64,
            a2a_command,
            shutdown_timeout_secs,
            kernel_idle_timeout_secs,
            allowed_cwds,
            home,
            process_cwd,
            temp_dir,
            fallback_lang: Lang::server_fallback(env),
        })
    }

    /// A configuration for tests and embedding: no YAML, no flags.
    pub fn for_state_dir(state_dir: PathBuf, env: EnvFn<'_>) -> Config {
        let cli = Cli::parse_from(["iac-code-agui"]);
        let mut c = Config::load(cli, env).expect("default configuration is valid");
        c.state_dir = state_dir;
        c.state_dir_is_default = false;
        c
    }

    /// Timeouts of the kernel client.
    pub fn kernel_timeouts(&self) -> a2a::Timeouts {
        a2a::Timeouts {
            stream_idle: std::time::Duration::from_secs_f64(self.kernel_idle_timeout_secs.min(1e9)),
            ..a2a::Timeouts::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<Config, String> {
        let mut argv = vec!["iac-code-agui"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load(cli, &move |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn kernel_idle_timeout_flag_env_yaml_and_errors() {
        assert_eq!(load(&[], &[]).unwrap().kernel_idle_timeout_secs, 60.0);
        assert_eq!(
            load(&[], &[]).unwrap().kernel_timeouts().stream_idle,
            std::time::Duration::from_secs(60)
        );
        let env = [("IAC_CODE_AGUI_KERNEL_IDLE_TIMEOUT", "5")];
        assert_eq!(load(&[], &env).unwrap().kernel_idle_timeout_secs, 5.0);
        let c = load(&["--kernel-idle-timeout", "2.5"], &env).unwrap();
        assert_eq!(
            c.kernel_timeouts().stream_idle,
            std::time::Duration::from_millis(2500)
        );
        assert!(load(&["--kernel-idle-timeout", "0"], &[])
            .unwrap()
            .kernel_timeouts()
            .stream_idle
            .is_zero());
        let f = yaml("kernel-idle-timeout: 7\n");
        let c = load(&["--config", f.path().to_str().unwrap()], &[]).unwrap();
        assert_eq!(c.kernel_idle_timeout_secs, 7.0);
        for bad in ["-1", "x", "nan"] {
            assert_eq!(
                load(&["--kernel-idle-timeout", bad], &[]).unwrap_err(),
                "--kernel-idle-timeout must be a non-negative number."
            );
        }
    }

    fn yaml(text: &str) -> tempfile::NamedTempFile {
        use std::io::Write;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn precedence_flag_env_yaml_default() {
        let f = yaml("port: 9001\na2a-url: http://127.0.0.1:1234\nauth_token: t\n");
        let p = f.path().to_str().unwrap();
        let env = [("IAC_CODE_AGUI_PORT", "9002")];
        assert_eq!(
            load(&["--config", p, "--port", "9003"], &env).unwrap().port,
            9003
        );
        assert_eq!(load(&["--config", p], &env).unwrap().port, 9002);
        let c = load(&["--config", p], &[]).unwrap();
        assert_eq!(c.port, 9001);
        assert_eq!(c.a2a_url.as_deref(), Some("http://127.0.0.1:1234/"));
        assert_eq!(c.auth_token.as_deref(), Some("t"));
        let c = load(&["--config", p], &[("IAC_CODE_AGUI_AUTH_TOKEN", "e")]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("e"));
        assert_eq!(load(&[], &[]).unwrap().port, 8000);
        assert_eq!(load(&[], &[]).unwrap().interrupt_ttl_secs, 86400);
    }

    #[test]
    fn validation_messages() {
        let port = "--port must be between 1 and 65535.";
        assert_eq!(load(&["--port", "0"], &[]).unwrap_err(), port);
        assert_eq!(load(&["--port", "x"], &[]).unwrap_err(), port);
        let f = yaml("port: 70000\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            port
        );
        let f = yaml("port: \"8000\"\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            port
        );
        let f = yaml("[1, 2]\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            "AG-UI config file must contain a YAML mapping."
        );
        assert_eq!(
            load(&["--config", "/nonexistent/x.yaml"], &[]).unwrap_err(),
            "Unable to load the AG-UI config file."
        );
        assert_eq!(
            load(&["--idle-shutdown", "-1"], &[]).unwrap_err(),
            "--idle-shutdown must be a non-negative number."
        );
        let f = yaml("state_dir: 5\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            "--state-dir must be a string."
        );
    }

    #[test]
    fn loopback_rule() {
        for bad in [
            "http://10.0.0.1:41242/",
            "ftp://127.0.0.1/",
            "http://example.com",
            "127.0.0.1:80",
        ] {
            assert_eq!(validate_a2a_url(bad).unwrap_err(), LOOPBACK_ERR, "{bad}");
        }
        assert_eq!(
            validate_a2a_url("http://[::1]:1/").unwrap(),
            "http://[::1]:1/"
        );
        assert_eq!(
            validate_a2a_url("http://LOCALHOST:1").unwrap(),
            "http://LOCALHOST:1/"
        );
        assert_eq!(
            validate_a2a_url("https://127.0.0.1:9/x//").unwrap(),
            "https://127.0.0.1:9/x/"
        );
    }

    #[test]
    fn state_dir_default_and_expansion() {
        let c = load(&[], &[("HOME", "/home/u")]).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/home/u/.iac-code/agui"));
        assert!(c.state_dir_is_default);
        let c = load(&[], &[("IAC_CODE_CONFIG_DIR", "/cfg")]).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/cfg/agui"));
        let c = load(&["--state-dir", "$X/s"], &[("X", "/data")]).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/data/s"));
        assert!(!c.state_dir_is_default);
    }
}
