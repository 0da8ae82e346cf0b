//! Command line, environment and YAML configuration: the flags, variables and keys of
//! `iac-code agui`, so the gateway is a drop-in replacement, plus additive options named alike.
//!
//! Layers, first wins: a flag or its environment variable (clap reads both; an empty value counts
//! as unset), the YAML file's key (dashes or underscores), the built-in default. The tokens have
//! no flag: environment, then YAML. YAML values are never coerced (`port: "8000"` is refused).
//! Every invalid value is a message on stderr and exit status 1.

use std::path::PathBuf;

use serde_yaml::Value as Yaml;

mod cli;

pub use cli::Cli;
use cli::FileConfig;

use crate::cors::Origins;
use crate::i18n::Lang;
use crate::paths;

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// Normalised loopback kernel URL (one trailing `/`); `None` ⇒ managed kernel.
    pub a2a_url: Option<String>,
    pub a2a_token: Option<String>,
    /// Bearer token of the gateway's own POST routes; `None` ⇒ no authentication.
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
    /// Origins allowed to call the gateway from a browser; empty ⇒ no CORS headers.
    pub cors_origins: Origins,
    /// How long a run goes on without a client; 0 ⇒ a disconnect cancels it.
    pub detach_grace_secs: f64,
    /// The replay buffer of a run, in bytes.
    pub replay_buffer_bytes: usize,
    /// The admin listener's address (`/metrics`); `None` ⇒ no metrics listener.
    pub metrics_listen: Option<String>,
    pub log_format: LogFormat,
    /// The PostgreSQL store's URL; `None` ⇒ the file store.
    pub state_url: Option<String>,
    /// How long an instance's heartbeat stays valid.
    pub lease_ttl_secs: f64,
    /// The URL other instances forward to (normalised, one trailing `/`).
    pub advertise_url: String,
    /// The managed kernel's shared session backup and task directories.
    pub kernel_backup_dir: Option<PathBuf>,
    pub kernel_persistence_dir: Option<PathBuf>,
}

/// How log lines look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// tracing-subscriber's human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The URL other instances reach this one at: the given one (plain `http://`, normalised to one
/// trailing `/`), else the bound host and port (a wildcard host has no address to give).
fn advertise(given: Option<&str>, host: &str, port: u16) -> Result<String, String> {
    match given {
        Some(u) => {
            let err = "--advertise-url must be an http:// URL.";
            let uri: http::Uri = u.trim().parse().map_err(|_| err.to_owned())?;
            if uri.scheme_str() != Some("http") || uri.authority().is_none() {
                return Err(err.into());
            }
            Ok(format!("{}/", u.trim().trim_end_matches('/')))
        }
        None => {
            let h = host.trim_start_matches('[').trim_end_matches(']');
            let wildcard = h
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_unspecified());
            if wildcard {
                return Ok(String::new());
            }
            let h = if h.contains(':') {
                format!("[{h}]")
            } else {
                h.to_owned()
            };
            Ok(format!("http://{h}:{port}/"))
        }
    }
}

/// `HOST:PORT` (a name or an address; `[v6]:port`), port 0..=65535.
fn listen_address(v: &str) -> Result<String, String> {
    let err = || "--metrics-listen must be HOST:PORT.".to_owned();
    let v = v.trim();
    let (host, port) = v.rsplit_once(':').ok_or_else(err)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(err());
    }
    Ok(v.to_owned())
}

/// The environment snapshot taken at start-up, shared by whatever reads variables later.
pub type Env = std::sync::Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Environment lookup (injected so tests never mutate the process environment).
pub type EnvFn<'a> = &'a dyn Fn(&str) -> Option<String>;

const LOOPBACK_ERR: &str = "The AG-UI adapter may connect only to a loopback A2A HTTP(S) URL.";
const CONFIG_UNREADABLE: &str = "Unable to load the AG-UI config file.";

/// Loads the YAML file, with `-` in keys normalised to `_`.
fn load_yaml(path: &str) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|_| CONFIG_UNREADABLE.to_owned())?;
    let v: Yaml = serde_yaml::from_str(&text).map_err(|_| CONFIG_UNREADABLE.to_owned())?;
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
        Yaml::Null => Ok(FileConfig::default()),
        m @ Yaml::Mapping(_) => serde_yaml::from_value(m).map_err(|_| CONFIG_UNREADABLE.to_owned()),
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

/// A flag's (or its variable's) value, when it is not empty.
fn given(v: Option<String>) -> Option<String> {
    v.filter(|s| !s.trim().is_empty())
}

/// A YAML string (an empty one counts as unset); another type is `err`.
fn yaml_string(v: Option<Yaml>, err: &str) -> Result<Option<String>, String> {
    match v {
        None | Some(Yaml::Null) => Ok(None),
        Some(Yaml::String(s)) => Ok(Some(s).filter(|s| !s.trim().is_empty())),
        Some(_) => Err(err.to_owned()),
    }
}

fn yaml_bool(v: Option<Yaml>, key: &str) -> Result<bool, String> {
    match v {
        None | Some(Yaml::Null) => Ok(false),
        Some(Yaml::Bool(b)) => Ok(b),
        Some(_) => Err(format!("{key} must be a boolean.")),
    }
}

/// A non-negative number of seconds: the flag, else the YAML key, else `default`.
fn seconds(
    flag: Option<String>,
    yaml: Option<Yaml>,
    default: f64,
    err: &str,
) -> Result<f64, String> {
    let v = match given(flag) {
        Some(s) => s.trim().parse::<f64>().ok().filter(|f| f.is_finite()),
        None => match yaml {
            None | Some(Yaml::Null) => Some(default),
            Some(Yaml::Number(n)) => n.as_f64(),
            Some(_) => None,
        },
    };
    v.filter(|v| *v >= 0.0 && v.is_finite())
        .ok_or_else(|| err.to_owned())
}

/// The CORS origins: the flags (or the variable's list), else YAML `cors_origins` (a list, or
/// one comma-separated string). Empty entries are skipped.
fn cors_origins(flags: Vec<String>, yaml: Option<Yaml>) -> Result<Origins, String> {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let flags: Vec<String> = flags.iter().flat_map(|f| split(f)).collect();
    let list = if !flags.is_empty() {
        flags
    } else {
        let err = "cors_origins must be a list of origins.";
        match yaml {
            None | Some(Yaml::Null) => vec![],
            Some(Yaml::String(s)) => split(&s),
            Some(Yaml::Sequence(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for i in items {
                    match i {
                        Yaml::String(s) => out.extend(split(&s)),
                        _ => return Err(err.to_owned()),
                    }
                }
                out
            }
            Some(_) => return Err(err.to_owned()),
        }
    };
    Origins::parse(&list)
}

impl Config {
    /// Builds the configuration from the parsed command line (flags and their variables) and the
    /// environment (tokens, paths, locale).
    pub fn load(cli: Cli, env: EnvFn<'_>) -> Result<Config, String> {
        let file = match cli.config.as_deref().filter(|c| !c.is_empty()) {
            Some(path) => load_yaml(path)?,
            None => FileConfig::default(),
        };
        let env_nonempty = |k: &str| env(k).filter(|v| !v.is_empty());

        let host = match given(cli.host) {
            Some(h) => h,
            None => yaml_string(file.host, "--host must be a string.")?
                .unwrap_or_else(|| "127.0.0.1".into()),
        };

        let port_err = "--port must be between 1 and 65535.";
        let port: i64 = match given(cli.port) {
            Some(p) => p.trim().parse().map_err(|_| port_err.to_owned())?,
            None => match file.port {
                None | Some(Yaml::Null) => 8000,
                Some(Yaml::Number(n)) => n.as_i64().ok_or(port_err)?,
                Some(_) => return Err(port_err.into()),
            },
        };
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or(port_err)?;

        // An empty URL consults the variable again (an empty flag does not hide it).
        let a2a_url = match given(cli.a2a_url).or_else(|| env_nonempty("IAC_CODE_AGUI_A2A_URL")) {
            Some(u) => Some(u),
            None => yaml_string(file.a2a_url, "--a2a-url must be a string.")?,
        };
        let a2a_url = a2a_url.as_deref().map(validate_a2a_url).transpose()?;

        // Tokens: the variable (even empty: it then switches the token off) > YAML.
        let token = |var: &str, yaml: Option<Yaml>, err: &str| -> Result<Option<String>, String> {
            let v = match env(var) {
                Some(v) => Some(v),
                None => match yaml {
                    None | Some(Yaml::Null) => None,
                    Some(Yaml::String(s)) => Some(s),
                    Some(_) => return Err(err.to_owned()),
                },
            };
            Ok(v.filter(|t| !t.is_empty()))
        };
        let auth_token = token(
            "IAC_CODE_AGUI_AUTH_TOKEN",
            file.auth_token,
            "auth_token must be a string.",
        )?;
        let a2a_token = token(
            "IAC_CODE_AGUI_A2A_TOKEN",
            file.a2a_token,
            "a2a_token must be a string.",
        )?;

        let debug = cli.debug || yaml_bool(file.debug, "debug")?;
        let log_stdout = if cli.log_stdout {
            true
        } else if cli.no_log_stdout {
            false
        } else {
            yaml_bool(file.log_stdout, "log_stdout")?
        };

        let idle_shutdown_secs = seconds(
            cli.idle_shutdown,
            file.idle_shutdown,
            0.0,
            "--idle-shutdown must be a non-negative number.",
        )?;
        let ttl_err = "--interrupt-ttl must be a non-negative integer.";
        let ttl = seconds(cli.interrupt_ttl, file.interrupt_ttl, 86400.0, ttl_err)?;
        if ttl.fract() != 0.0 {
            return Err(ttl_err.into());
        }
        let shutdown_timeout_secs = seconds(
            cli.shutdown_timeout,
            file.shutdown_timeout,
            10.0,
            "--shutdown-timeout must be a non-negative number.",
        )?;
        let kernel_idle_timeout_secs = seconds(
            cli.kernel_idle_timeout,
            file.kernel_idle_timeout,
            60.0,
            "--kernel-idle-timeout must be a non-negative number.",
        )?;

        let a2a_command = match given(cli.a2a_command) {
            Some(c) => c,
            None => yaml_string(file.a2a_command, "--a2a-command must be a string.")?
                .unwrap_or_else(|| "iac-code".into()),
        };

        let cors_origins = cors_origins(cli.cors_origin, file.cors_origins)?;
        let detach_grace_secs = seconds(
            cli.detach_grace,
            file.detach_grace,
            0.0,
            "--detach-grace must be a non-negative number.",
        )?
        .min(1e9);
        let replay_err = "--replay-buffer must be a positive integer (bytes).";
        let replay_buffer = seconds(cli.replay_buffer, file.replay_buffer, 1048576.0, replay_err)?;
        if replay_buffer < 1.0 || replay_buffer.fract() != 0.0 || replay_buffer > 1e12 {
            return Err(replay_err.into());
        }

        let metrics_listen = match given(cli.metrics_listen) {
            Some(v) => Some(v),
            None => yaml_string(file.metrics_listen, "--metrics-listen must be HOST:PORT.")?,
        };
        let metrics_listen = metrics_listen.as_deref().map(listen_address).transpose()?;
        let format_err = "--log-format must be text or json.";
        let log_format = match given(cli.log_format) {
            Some(v) => Some(v),
            None => yaml_string(file.log_format, format_err)?,
        };
        let log_format = match log_format.as_deref().map(str::trim) {
            None => LogFormat::Text,
            Some(f) if f.eq_ignore_ascii_case("text") => LogFormat::Text,
            Some(f) if f.eq_ignore_ascii_case("json") => LogFormat::Json,
            Some(_) => return Err(format_err.into()),
        };

        let state_url = match given(cli.state_url) {
            Some(v) => Some(v),
            None => yaml_string(file.state_url, "--state-url must be a postgres:// URL.")?,
        };
        if let Some(u) = &state_url {
            if !(u.starts_with("postgres://") || u.starts_with("postgresql://"))
                || u.parse::<tokio_postgres::Config>().is_err()
            {
                return Err("--state-url must be a postgres:// URL.".into());
            }
        }
        let lease_err = "--lease-ttl must be a number of seconds, at least 1.";
        let lease_ttl_secs = seconds(cli.lease_ttl, file.lease_ttl, 15.0, lease_err)?;
        if !(1.0..=86400.0).contains(&lease_ttl_secs) {
            return Err(lease_err.into());
        }
        let advertise_url = match given(cli.advertise_url) {
            Some(v) => Some(v),
            None => yaml_string(
                file.advertise_url,
                "--advertise-url must be an http:// URL.",
            )?,
        };
        let advertise_url = advertise(advertise_url.as_deref(), &host, port)?;
        if state_url.is_some() && advertise_url.is_empty() {
            return Err(
                "--advertise-url is needed with --state-url when --host is a wildcard address."
                    .into(),
            );
        }

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
        let explicit = match given(cli.state_dir) {
            Some(s) => Some(s),
            None => yaml_string(file.state_dir, "--state-dir must be a string.")?,
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

        let dir_option = |flag: Option<String>, yaml: Option<Yaml>, err: &str| {
            let v = match given(flag) {
                Some(v) => Some(v),
                None => yaml_string(yaml, err)?,
            };
            Ok::<_, String>(v.map(|v| expand(&v)))
        };
        let kernel_backup_dir = dir_option(
            cli.kernel_backup_dir,
            file.kernel_backup_dir,
            "--kernel-backup-dir must be a string.",
        )?;
        let kernel_persistence_dir = dir_option(
            cli.kernel_persistence_dir,
            file.kernel_persistence_dir,
            "--kernel-persistence-dir must be a string.",
        )?;

        let allowed_cwds = env_nonempty("IAC_CODE_AGUI_ALLOWED_CWDS")
            .or_else(|| env_nonempty("IACCODE_A2A_ALLOWED_CWDS"));
        let temp_dir = ["TMPDIR", "TEMP", "TMP"]
            .iter()
            .find_map(|k| env_nonempty(k))
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp"));

        Ok(Config {
            host,
            port,
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
            cors_origins,
            detach_grace_secs,
            replay_buffer_bytes: replay_buffer as usize,
            metrics_listen,
            log_format,
            state_url,
            lease_ttl_secs,
            advertise_url,
            kernel_backup_dir,
            kernel_persistence_dir,
        })
    }

    /// A configuration for tests and embedding: no flags, no YAML, no process environment (only
    /// `env`).
    pub fn for_state_dir(state_dir: PathBuf, env: EnvFn<'_>) -> Config {
        let mut c = Config::load(Cli::default(), env).expect("default configuration is valid");
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
    use clap::Parser as _;
    use std::path::Path;

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

    /// The variable of each option (clap reads it where the flag is absent; the process tests
    /// run the binary with them).
    #[test]
    fn every_option_with_a_variable_declares_it() {
        use clap::CommandFactory;
        let cmd = Cli::command();
        let var = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .and_then(|v| v.to_str())
                .map(str::to_owned)
        };
        for (id, name) in [
            ("host", "IAC_CODE_AGUI_HOST"),
            ("port", "IAC_CODE_AGUI_PORT"),
            ("a2a_url", "IAC_CODE_AGUI_A2A_URL"),
            ("state_dir", "IAC_CODE_AGUI_STATE_DIR"),
            ("interrupt_ttl", "IAC_CODE_AGUI_INTERRUPT_TTL"),
            ("a2a_command", "IAC_CODE_AGUI_A2A_COMMAND"),
            ("shutdown_timeout", "IAC_CODE_AGUI_SHUTDOWN_TIMEOUT"),
            ("kernel_idle_timeout", "IAC_CODE_AGUI_KERNEL_IDLE_TIMEOUT"),
            ("cors_origin", "IAC_CODE_AGUI_CORS_ORIGINS"),
            ("detach_grace", "IAC_CODE_AGUI_DETACH_GRACE"),
            ("replay_buffer", "IAC_CODE_AGUI_REPLAY_BUFFER"),
            ("metrics_listen", "IAC_CODE_AGUI_METRICS_LISTEN"),
            ("log_format", "IAC_CODE_AGUI_LOG_FORMAT"),
            ("state_url", "IAC_CODE_AGUI_STATE_URL"),
            ("lease_ttl", "IAC_CODE_AGUI_LEASE_TTL"),
            ("advertise_url", "IAC_CODE_AGUI_ADVERTISE_URL"),
            ("kernel_backup_dir", "IAC_CODE_AGUI_KERNEL_BACKUP_DIR"),
            (
                "kernel_persistence_dir",
                "IAC_CODE_AGUI_KERNEL_PERSISTENCE_DIR",
            ),
        ] {
            assert_eq!(var(id).as_deref(), Some(name), "{id}");
        }
        // The reference has no variable for these.
        assert_eq!(var("idle_shutdown"), None);
        assert_eq!(var("config"), None);
    }

    #[test]
    fn cors_origins_from_flags_or_yaml_and_refused_values() {
        assert!(load(&[], &[]).unwrap().cors_origins.is_empty());
        let c = load(
            &[
                "--cors-origin",
                "https://a.test",
                "--cors-origin",
                "http://b.test:8080,http://c.test/",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.cors_origins.as_slice(),
            ["https://a.test", "http://b.test:8080", "http://c.test"]
        );
        let dir = tempfile::tempdir().unwrap();
        let yaml = |text: &str| {
            let p = dir.path().join("c.yaml");
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let p = yaml("cors-origins: [\"https://y.test\"]\n");
        let c = load(&["--config", &p], &[]).unwrap();
        assert_eq!(c.cors_origins.as_slice(), ["https://y.test"]);
        let c = load(&["--config", &p, "--cors-origin", "https://flag.test"], &[]).unwrap();
        assert_eq!(
            c.cors_origins.as_slice(),
            ["https://flag.test"],
            "flag beats YAML"
        );
        let p = yaml("cors_origins: \"https://s.test, https://t.test\"\n");
        let c = load(&["--config", &p], &[]).unwrap();
        assert_eq!(
            c.cors_origins.as_slice(),
            ["https://s.test", "https://t.test"]
        );
        let p = yaml("cors_origins: 5\n");
        assert_eq!(
            load(&["--config", &p], &[]).unwrap_err(),
            "cors_origins must be a list of origins."
        );
        let e = load(&["--cors-origin", "*"], &[]).unwrap_err();
        assert!(e.starts_with("--cors-origin must be an origin"), "{e}");
    }

    #[test]
    fn detach_grace_and_replay_buffer() {
        let c = load(&[], &[]).unwrap();
        assert_eq!((c.detach_grace_secs, c.replay_buffer_bytes), (0.0, 1048576));
        let c = load(&["--detach-grace", "30", "--replay-buffer", "4096"], &[]).unwrap();
        assert_eq!((c.detach_grace_secs, c.replay_buffer_bytes), (30.0, 4096));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, "detach-grace: 2.5\nreplay_buffer: 100\n").unwrap();
        let c = load(&["--config", p.to_str().unwrap()], &[]).unwrap();
        assert_eq!((c.detach_grace_secs, c.replay_buffer_bytes), (2.5, 100));
        for bad in [["--detach-grace", "-1"], ["--detach-grace", "x"]] {
            assert_eq!(
                load(&bad, &[]).unwrap_err(),
                "--detach-grace must be a non-negative number."
            );
        }
        for bad in ["0", "1.5", "-3", "x"] {
            assert_eq!(
                load(&["--replay-buffer", bad], &[]).unwrap_err(),
                "--replay-buffer must be a positive integer (bytes)."
            );
        }
    }

    #[test]
    fn kernel_idle_timeout_flag_yaml_and_errors() {
        assert_eq!(load(&[], &[]).unwrap().kernel_idle_timeout_secs, 60.0);
        assert_eq!(
            load(&[], &[]).unwrap().kernel_timeouts().stream_idle,
            std::time::Duration::from_secs(60)
        );
        let c = load(&["--kernel-idle-timeout", "2.5"], &[]).unwrap();
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
    fn several_instances_options() {
        let c = load(&[], &[]).unwrap();
        assert_eq!(c.state_url, None);
        assert_eq!(c.lease_ttl_secs, 15.0);
        assert_eq!(c.advertise_url, "http://127.0.0.1:8000/");
        assert_eq!(
            (c.kernel_backup_dir, c.kernel_persistence_dir),
            (None, None)
        );
        let c = load(
            &[
                "--state-url",
                "postgres://agui@127.0.0.1:5432/agui",
                "--lease-ttl",
                "3",
                "--advertise-url",
                "http://10.0.0.5:8000",
                "--kernel-backup-dir",
                "/shared/backup",
                "--kernel-persistence-dir",
                "/shared/tasks",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            c.state_url.as_deref(),
            Some("postgres://agui@127.0.0.1:5432/agui")
        );
        assert_eq!(c.lease_ttl_secs, 3.0);
        assert_eq!(c.advertise_url, "http://10.0.0.5:8000/");
        assert_eq!(
            c.kernel_backup_dir.as_deref(),
            Some(Path::new("/shared/backup"))
        );
        assert_eq!(
            c.kernel_persistence_dir.as_deref(),
            Some(Path::new("/shared/tasks"))
        );
        // A wildcard bind has no address to advertise: other instances cannot forward to it.
        assert_eq!(load(&["--host", "0.0.0.0"], &[]).unwrap().advertise_url, "");
        assert_eq!(
            load(
                &["--host", "0.0.0.0", "--state-url", "postgres://h/db"],
                &[]
            )
            .unwrap_err(),
            "--advertise-url is needed with --state-url when --host is a wildcard address."
        );
        assert_eq!(
            load(&["--host", "::1", "--port", "9"], &[])
                .unwrap()
                .advertise_url,
            "http://[::1]:9/"
        );
        for (args, err) in [
            (
                &["--state-url", "mysql://x"][..],
                "--state-url must be a postgres:// URL.",
            ),
            (
                &["--state-url", "postgres://h:notaport/db"][..],
                "--state-url must be a postgres:// URL.",
            ),
            (
                &["--lease-ttl", "0"][..],
                "--lease-ttl must be a number of seconds, at least 1.",
            ),
            (
                &["--lease-ttl", "x"][..],
                "--lease-ttl must be a number of seconds, at least 1.",
            ),
            (
                &["--advertise-url", "https://a"][..],
                "--advertise-url must be an http:// URL.",
            ),
            (
                &["--advertise-url", "nope"][..],
                "--advertise-url must be an http:// URL.",
            ),
        ] {
            assert_eq!(load(args, &[]).unwrap_err(), err, "{args:?}");
        }
    }

    #[test]
    fn metrics_listener_and_log_format() {
        let c = load(&[], &[]).unwrap();
        assert_eq!((c.metrics_listen, c.log_format), (None, LogFormat::Text));
        let f = yaml("metrics-listen: 127.0.0.1:9464\nlog_format: json\n");
        let p = f.path().to_str().unwrap();
        let c = load(&["--config", p], &[]).unwrap();
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:9464"));
        assert_eq!(c.log_format, LogFormat::Json);
        let c = load(
            &[
                "--config",
                p,
                "--metrics-listen",
                "[::1]:0",
                "--log-format",
                "TEXT",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.metrics_listen.as_deref(), Some("[::1]:0"));
        assert_eq!(c.log_format, LogFormat::Text);
        for bad in ["9464", ":9464", "localhost:x", "h:70000"] {
            assert_eq!(
                load(&["--metrics-listen", bad], &[]).unwrap_err(),
                "--metrics-listen must be HOST:PORT."
            );
        }
        assert_eq!(
            load(&["--log-format", "xml"], &[]).unwrap_err(),
            "--log-format must be text or json."
        );
        let f = yaml("log_format: 1\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            "--log-format must be text or json."
        );
    }

    #[test]
    fn precedence_flag_yaml_default() {
        let f = yaml("port: 9001\na2a-url: http://127.0.0.1:1234\nauth_token: t\n");
        let p = f.path().to_str().unwrap();
        assert_eq!(
            load(&["--config", p, "--port", "9003"], &[]).unwrap().port,
            9003
        );
        // An empty flag (or variable) counts as unset.
        assert_eq!(
            load(&["--config", p, "--port", ""], &[]).unwrap().port,
            9001
        );
        let c = load(&["--config", p], &[]).unwrap();
        assert_eq!(c.port, 9001);
        assert_eq!(c.a2a_url.as_deref(), Some("http://127.0.0.1:1234/"));
        assert_eq!(c.auth_token.as_deref(), Some("t"));
        let c = load(&["--config", p], &[("IAC_CODE_AGUI_AUTH_TOKEN", "e")]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("e"));
        // An empty token variable switches the YAML token off.
        let c = load(&["--config", p], &[("IAC_CODE_AGUI_AUTH_TOKEN", "")]).unwrap();
        assert_eq!(c.auth_token, None);
        // An empty URL flag consults the variable again.
        let c = load(
            &["--a2a-url", ""],
            &[("IAC_CODE_AGUI_A2A_URL", "http://localhost:7/")],
        )
        .unwrap();
        assert_eq!(c.a2a_url.as_deref(), Some("http://localhost:7/"));
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
