//! Command line, environment and YAML configuration: the flags, variables and keys of
//! `iac-code agui`, so the gateway is a drop-in replacement, plus additive options named alike.
//!
//! Layers, first wins (`layers`): a flag or its environment variable (clap reads both; an empty
//! value counts as unset), the YAML file's key (dashes or underscores), the built-in default. The
//! tokens have no flag: environment, then YAML. YAML values are never coerced (`port: "8000"` is
//! refused). The values are then checked (`check`, pure). Every invalid value is a message on
//! stderr and exit status 1.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub mod auth;
mod caps;
mod check;
mod cli;
pub mod egress;
pub mod isolation;
mod layers;
mod machine;

pub use caps::Caps;
pub use check::a2a_url as validate_a2a_url;
pub use cli::Cli;
pub use layers::Served;
use layers::{Count, Integer, Layers, List, Number, Opt, Place, Switch, Text, YamlFile};

use crate::edge::cors::Origins;
use crate::edge::hosts::AllowedHosts;
use crate::urls;
use engine::i18n::Lang;
use engine::paths;

/// The validated configuration. Its `Debug` shows no secret.
#[derive(Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// Normalised loopback kernel URLs (one trailing `/` each), several for a pool of external
    /// kernels; none ⇒ managed kernels.
    pub a2a_urls: Vec<String>,
    pub a2a_token: Option<String>,
    /// Bearer token of the gateway's own POST routes; `None` ⇒ no authentication.
    pub auth_token: Option<String>,
    pub debug: bool,
    pub log_stdout: bool,
    pub state_dir: PathBuf,
    /// True when the state dir is the default one (then the config dir is created at start-up).
    pub state_dir_is_default: bool,
    /// Exit after this long idle; zero ⇒ never.
    pub idle_shutdown: Duration,
    pub interrupt_ttl_secs: u64,
    pub a2a_command: String,
    /// How long open streams get to finish after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// Longest silence of a kernel stream; zero ⇒ none.
    pub kernel_idle_timeout: Duration,
    /// Longest wait on a client that reads nothing; past it the client is gone.
    pub client_stall_timeout: Duration,
    /// Raw allowed-cwds list: `IAC_CODE_AGUI_ALLOWED_CWDS`, else `IACCODE_A2A_ALLOWED_CWDS`.
    pub allowed_cwds: Option<String>,
    /// `HOME` (for `~` expansion).
    pub home: Option<String>,
    /// Server fallback language (from the locale variables).
    pub fallback_lang: Lang,
    /// Origins allowed to call the gateway from a browser; empty ⇒ no CORS headers.
    pub cors_origins: Origins,
    /// How long a run goes on without a client; zero ⇒ a disconnect cancels it.
    pub detach_grace: Duration,
    /// The replay buffer of a run, in bytes.
    pub replay_buffer_bytes: usize,
    /// The admin listener's address (`/metrics`); `None` ⇒ no metrics listener.
    pub metrics_listen: Option<String>,
    pub log_format: LogFormat,
    /// The PostgreSQL store's URL; `None` ⇒ the file store.
    pub state_url: Option<String>,
    /// How long an instance's heartbeat stays valid.
    pub lease_ttl: Duration,
    /// The URL other instances forward to (normalised, one trailing `/`).
    pub advertise_url: String,
    /// The managed kernel's shared session backup and task directories.
    pub kernel_backup_dir: Option<PathBuf>,
    pub kernel_persistence_dir: Option<PathBuf>,
    /// Variables of the gateway's environment passed to the managed kernel besides the
    /// allow-list (never an `IAC_CODE_AGUI_*`).
    pub kernel_env: Vec<String>,
    /// The bounds on concurrent work (connections, runs, detached runs, readers, guidance).
    pub caps: Caps,
    /// Images decoded at once across requests (the others wait their turn).
    pub max_image_decodes: usize,
    /// Managed kernels (`--kernels`; 1 with an external one); with isolation `user`, the most
    /// users' kernels alive at once.
    pub kernels: usize,
    /// Whose kernel runs a user's turns (`--kernel-isolation` and its options).
    pub isolation: isolation::Isolation,
    /// The LLM egress (`--llm-upstream` and its options): kernels reach the provider through
    /// the gateway, which holds the key.
    pub egress: Option<egress::Egress>,
    /// The YAML configuration file (`--config`), when one was read.
    pub config_file: Option<PathBuf>,
    /// How long a request body may take to arrive whole after its head.
    pub body_timeout: Duration,
    /// How long a request body an early answer left unread is read on and discarded; zero ⇒
    /// not at all.
    pub linger_timeout: Duration,
    /// The host names requests without a token may carry (`Host`).
    pub allowed_hosts: AllowedHosts,
    /// Serving without a token on a non-loopback address was asked for.
    pub allow_unauthenticated: bool,
    /// Where the console is served at `/console/`.
    pub console: Served,
    /// JWTs accepted, and how they are checked.
    pub jwt: auth::JwtConfig,
    /// The secret instances sign forwarded requests with (`forward`): at least 32 bytes.
    pub cluster_secret: Option<String>,
    /// The CA certificates (PEM) the state database's TLS certificate must chain to.
    pub state_ca_file: Option<PathBuf>,
    /// The main listener's certificate and key (PEM): it serves TLS.
    pub tls: Option<TlsPair>,
    /// The admin listener's.
    pub metrics_tls: Option<TlsPair>,
    /// The CA certificates (PEM) the other instances' certificates chain to (forwards over
    /// `https://`).
    pub cluster_ca: Option<PathBuf>,
}

/// A certificate and its key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPair {
    pub cert: PathBuf,
    pub key: PathBuf,
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

pub use kernel::environment::{Env, EnvFn};

// The options: YAML key, the kind of its value (which YAML type it takes, how its flag is read)
// and the message for a value not of that kind. Flags and variables are in `cli`; defaults and
// checks in `Config::load`.
const HOST: Opt<Text> = Opt::new("host", "--host must be a string.");
const PORT: Opt<Integer> = Opt::new("port", check::PORT);
const A2A_URL: Opt<List> = Opt::new("a2a_url", "--a2a-url must be a string.");
const AUTH_TOKEN: Opt<Text> = Opt::new("auth_token", "auth_token must be a string.");
const A2A_TOKEN: Opt<Text> = Opt::new("a2a_token", "a2a_token must be a string.");
const CLUSTER_SECRET: Opt<Text> = Opt::new("cluster_secret", "cluster_secret must be a string.");
const DEBUG: Opt<Switch> = Opt::new("debug", "debug must be a boolean.");
const LOG_STDOUT: Opt<Switch> = Opt::new("log_stdout", "log_stdout must be a boolean.");
const IDLE_SHUTDOWN: Opt<Number> = Opt::new(
    "idle_shutdown",
    "--idle-shutdown must be a non-negative number.",
);
const INTERRUPT_TTL: Opt<Number> = Opt::new("interrupt_ttl", check::INTERRUPT_TTL);
const A2A_COMMAND: Opt<Text> = Opt::new("a2a_command", "--a2a-command must be a string.");
const SHUTDOWN_TIMEOUT: Opt<Number> = Opt::new(
    "shutdown_timeout",
    "--shutdown-timeout must be a non-negative number.",
);
const KERNEL_IDLE_TIMEOUT: Opt<Number> = Opt::new(
    "kernel_idle_timeout",
    "--kernel-idle-timeout must be a non-negative number.",
);
const CLIENT_STALL_TIMEOUT: Opt<Number> =
    Opt::new("client_stall_timeout", check::CLIENT_STALL_TIMEOUT);
const CORS_ORIGINS: Opt<List> = Opt::new("cors_origins", "cors_origins must be a list of origins.");
const DETACH_GRACE: Opt<Number> = Opt::new(
    "detach_grace",
    "--detach-grace must be a non-negative number.",
);
const REPLAY_BUFFER: Opt<Number> = Opt::new("replay_buffer", check::REPLAY_BUFFER);
const METRICS_LISTEN: Opt<Text> = Opt::new("metrics_listen", check::METRICS_LISTEN);
const LOG_FORMAT: Opt<Text> = Opt::new("log_format", check::LOG_FORMAT);
const STATE_URL: Opt<Text> = Opt::new("state_url", check::STATE_URL);
const LEASE_TTL: Opt<Number> = Opt::new("lease_ttl", check::LEASE_TTL);
const ADVERTISE_URL: Opt<Text> = Opt::new("advertise_url", check::ADVERTISE_URL);
const TLS_CERT: Opt<Text> = Opt::new("tls_cert", "--tls-cert must be a string.");
const TLS_KEY: Opt<Text> = Opt::new("tls_key", "--tls-key must be a string.");
const METRICS_TLS_CERT: Opt<Text> =
    Opt::new("metrics_tls_cert", "--metrics-tls-cert must be a string.");
const METRICS_TLS_KEY: Opt<Text> =
    Opt::new("metrics_tls_key", "--metrics-tls-key must be a string.");
const CLUSTER_CA: Opt<Text> = Opt::new("cluster_ca", "--cluster-ca must be a string.");
const STATE_CA_FILE: Opt<Text> = Opt::new("state_ca_file", "--state-ca-file must be a string.");
const STATE_DIR: Opt<Text> = Opt::new("state_dir", "--state-dir must be a string.");
const KERNEL_BACKUP_DIR: Opt<Text> =
    Opt::new("kernel_backup_dir", "--kernel-backup-dir must be a string.");
const KERNEL_PERSISTENCE_DIR: Opt<Text> = Opt::new(
    "kernel_persistence_dir",
    "--kernel-persistence-dir must be a string.",
);
const KERNEL_ENV: Opt<List> = Opt::new("kernel_env", check::KERNEL_ENV);
const MAX_IMAGE_DECODES: Opt<Integer> = Opt::new("max_image_decodes", check::MAX_IMAGE_DECODES);
const KERNELS: Opt<Count> = Opt::new("kernels", check::KERNELS);
const BODY_TIMEOUT: Opt<Number> = Opt::new("body_timeout", check::BODY_TIMEOUT);
const LINGER_TIMEOUT: Opt<Number> = Opt::new(
    "linger_timeout",
    "--linger-timeout must be a non-negative number.",
);
const ALLOWED_HOSTS: Opt<List> = Opt::new("allowed_hosts", crate::edge::hosts::INVALID);
const ALLOW_UNAUTHENTICATED: Opt<Switch> = Opt::new(
    "allow_unauthenticated",
    "allow_unauthenticated must be a boolean.",
);
const CONSOLE: Opt<Place> = Opt::new("console", "--console must be main, admin or off.");

impl Config {
    /// Builds the configuration from the parsed command line (flags and their variables) and the
    /// environment (tokens, paths, locale).
    pub fn load(mut cli: Cli, env: EnvFn<'_>) -> Result<Config, String> {
        let file = match cli.config.as_deref().filter(|c| !c.is_empty()) {
            Some(path) => YamlFile::read(path)?,
            None => YamlFile::default(),
        };
        let config_file = cli
            .config
            .as_deref()
            .filter(|c| !c.is_empty())
            .map(PathBuf::from);
        let l = Layers { file: &file, env };
        let log_stdout_flag = cli.log_stdout_flag();
        let caps_flags = cli.caps_flags();
        let jwt_flags = cli.jwt_flags();
        let isolation_flags = cli.isolation_flags();
        let egress_flags = cli.egress_flags();
        let seconds = |opt: &Opt<Number>, flag, default| {
            check::seconds(l.get(opt, flag)?.unwrap_or(default), opt.err())
        };
        // An option a line or two: its layers, default and check. The order is part of the
        // behaviour: the first invalid value is the one reported.
        let host = l
            .get(&HOST, cli.host)?
            .unwrap_or_else(|| "127.0.0.1".into());
        let port = check::port(l.get(&PORT, cli.port)?.unwrap_or(8000))?;
        let a2a_urls = l.list_or_var(&A2A_URL, "IAC_CODE_AGUI_A2A_URL", cli.a2a_url)?;
        let a2a_urls = check::a2a_urls(a2a_urls.unwrap_or_default())?;
        let auth_token = l.token(&AUTH_TOKEN, "IAC_CODE_AGUI_AUTH_TOKEN")?;
        let a2a_token = l.token(&A2A_TOKEN, "IAC_CODE_AGUI_A2A_TOKEN")?;
        let cluster_secret = l.token(&CLUSTER_SECRET, "IAC_CODE_AGUI_CLUSTER_SECRET")?;
        check::cluster_secret(cluster_secret.as_deref())?;
        let debug = l.get(&DEBUG, cli.debug.then_some(true))?.unwrap_or(false);
        let log_stdout = l.get(&LOG_STDOUT, log_stdout_flag)?.unwrap_or(false);
        let idle_shutdown = seconds(&IDLE_SHUTDOWN, cli.idle_shutdown, 0.0)?;
        let ttl = l.get(&INTERRUPT_TTL, cli.interrupt_ttl)?.unwrap_or(86400.0);
        let interrupt_ttl_secs = check::interrupt_ttl(ttl)?;
        let shutdown_timeout = seconds(&SHUTDOWN_TIMEOUT, cli.shutdown_timeout, 10.0)?;
        let kernel_idle_timeout = seconds(&KERNEL_IDLE_TIMEOUT, cli.kernel_idle_timeout, 60.0)?;
        let client_stall_timeout = l
            .get(&CLIENT_STALL_TIMEOUT, cli.client_stall_timeout)?
            .unwrap_or(60.0);
        let client_stall_timeout = check::client_stall_timeout(client_stall_timeout)?;
        let a2a_command = l.get(&A2A_COMMAND, cli.a2a_command)?;
        let a2a_command = a2a_command.unwrap_or_else(|| "iac-code".into());
        let cors_origins = l.get(&CORS_ORIGINS, Some(cli.cors_origin))?;
        let cors_origins = Origins::parse(&cors_origins.unwrap_or_default())?;
        let detach_grace = seconds(&DETACH_GRACE, cli.detach_grace, 0.0)?;
        let replay_buffer = l
            .get(&REPLAY_BUFFER, cli.replay_buffer)?
            .unwrap_or(1048576.0);
        let replay_buffer_bytes = check::replay_buffer(replay_buffer)?;
        let metrics_listen = l.get(&METRICS_LISTEN, cli.metrics_listen)?;
        let metrics_listen = metrics_listen.as_deref().map(check::listen_address);
        let metrics_listen = metrics_listen.transpose()?;
        let log_format = l.get(&LOG_FORMAT, cli.log_format)?;
        let log_format = check::log_format(log_format.as_deref())?;
        let state_url = l.get(&STATE_URL, cli.state_url)?;
        let state_tls = state_url.as_deref().map(check::state_url).transpose()?;
        let lease_ttl = check::lease_ttl(l.get(&LEASE_TTL, cli.lease_ttl)?.unwrap_or(15.0))?;
        let advertise_url = l.get(&ADVERTISE_URL, cli.advertise_url)?;
        let tls_given = cli
            .tls_cert
            .as_deref()
            .is_some_and(|c| !c.trim().is_empty())
            || file.get("tls_cert").is_some();
        let advertise_url = check::advertise(advertise_url.as_deref(), &host, port, tls_given)?;
        check::advertised(state_url.as_deref(), &advertise_url)?;

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
        let dir = |opt, flag| Ok::<_, String>(l.get(opt, flag)?.map(|d: String| expand(&d)));
        let state_dir = dir(&STATE_DIR, cli.state_dir)?;
        let state_dir_is_default = state_dir.is_none();
        let state_dir = state_dir.unwrap_or_else(|| {
            let config_dir = match env("IAC_CODE_CONFIG_DIR").filter(|s| !s.trim().is_empty()) {
                Some(c) => expand(&c),
                None => expand("~/.iac-code"),
            };
            config_dir.join("agui")
        });
        let kernel_backup_dir = dir(&KERNEL_BACKUP_DIR, cli.kernel_backup_dir)?;
        let state_ca_file = dir(&STATE_CA_FILE, cli.state_ca_file)?;
        check::state_ca(state_tls.flatten(), state_ca_file.is_some())?;
        let pair = |cert: Option<PathBuf>, key: Option<PathBuf>, flags: &str| match (cert, key) {
            (Some(c), Some(k)) => Ok(Some(TlsPair { cert: c, key: k })),
            (None, None) => Ok(None),
            _ => Err(format!("{flags} must be given together.")),
        };
        let tls = pair(
            dir(&TLS_CERT, cli.tls_cert)?,
            dir(&TLS_KEY, cli.tls_key)?,
            "--tls-cert and --tls-key",
        )?;
        let metrics_tls = pair(
            dir(&METRICS_TLS_CERT, cli.metrics_tls_cert)?,
            dir(&METRICS_TLS_KEY, cli.metrics_tls_key)?,
            "--metrics-tls-cert and --metrics-tls-key",
        )?;
        let cluster_ca = dir(&CLUSTER_CA, cli.cluster_ca)?;
        let kernel_persistence_dir = dir(&KERNEL_PERSISTENCE_DIR, cli.kernel_persistence_dir)?;
        let kernel_env = l.get(&KERNEL_ENV, Some(cli.kernel_env))?;
        let kernel_env = check::kernel_env(kernel_env.unwrap_or_default())?;
        let caps = caps::load(&l, caps_flags)?;
        let max_image_decodes = l.get(&MAX_IMAGE_DECODES, cli.max_image_decodes)?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as i64);
        let max_image_decodes = check::max_image_decodes(max_image_decodes.unwrap_or(cores))?;
        let kernels = l.get(&KERNELS, cli.kernels)?;
        let kernels = check::kernels(
            kernels,
            !a2a_urls.is_empty(),
            cores,
            machine::memory_bytes(),
        )?;
        let isolation = isolation::load(&l, isolation_flags, !a2a_urls.is_empty())?;
        let egress = egress::load(&l, egress_flags, !a2a_urls.is_empty())?;
        let body_timeout = l.get(&BODY_TIMEOUT, cli.body_timeout)?.unwrap_or(60.0);
        let body_timeout = check::body_timeout(body_timeout)?;
        let linger_timeout = seconds(&LINGER_TIMEOUT, cli.linger_timeout, 10.0)?;
        let allowed_hosts = l.get(&ALLOWED_HOSTS, Some(cli.allowed_host))?;
        let allowed_hosts =
            AllowedHosts::new(&allowed_hosts.unwrap_or_default(), &host, &advertise_url)?;
        let allow_unauthenticated = cli.allow_unauthenticated.then_some(true);
        let allow_unauthenticated = l.get(&ALLOW_UNAUTHENTICATED, allow_unauthenticated)?;
        let allow_unauthenticated = allow_unauthenticated.unwrap_or(false);
        let console = l.get(&CONSOLE, cli.console)?.unwrap_or(Served::Off);
        check::console(console, metrics_listen.is_some())?;
        let jwt = auth::load(&l, jwt_flags)?;

        let env_nonempty = |k: &str| env(k).filter(|v| !v.is_empty());
        let allowed_cwds = env_nonempty("IAC_CODE_AGUI_ALLOWED_CWDS")
            .or_else(|| env_nonempty("IACCODE_A2A_ALLOWED_CWDS"));

        Ok(Config {
            host,
            port,
            a2a_urls,
            a2a_token,
            auth_token,
            debug,
            log_stdout,
            state_dir,
            state_dir_is_default,
            idle_shutdown,
            interrupt_ttl_secs,
            a2a_command,
            shutdown_timeout,
            kernel_idle_timeout,
            client_stall_timeout,
            allowed_cwds,
            home,
            fallback_lang: Lang::server_fallback(env),
            cors_origins,
            detach_grace,
            replay_buffer_bytes,
            metrics_listen,
            log_format,
            state_url,
            lease_ttl,
            advertise_url,
            kernel_backup_dir,
            kernel_persistence_dir,
            kernel_env,
            caps,
            max_image_decodes,
            kernels,
            isolation,
            egress,
            config_file,
            body_timeout,
            linger_timeout,
            allowed_hosts,
            allow_unauthenticated,
            console,
            jwt,
            cluster_secret,
            state_ca_file,
            tls,
            metrics_tls,
            cluster_ca,
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

    /// The workspace root when none is configured: `<state-dir>/workspaces`, a private directory
    /// beside the thread state (created 0700 at start-up), never the process's directory or the
    /// shared temporary one, where anyone could plant a workspace or read one.
    pub fn default_workspace_root(&self) -> PathBuf {
        self.state_dir.join("workspaces")
    }

    /// What the engine is told of this configuration, with `channel_capacity` events buffered
    /// per run towards a slow client.
    pub fn engine_settings(&self, channel_capacity: usize) -> engine::Settings {
        engine::Settings {
            caps: self.caps,
            client_stall_timeout: self.client_stall_timeout,
            detach_grace: self.detach_grace,
            interrupt_ttl_secs: self.interrupt_ttl_secs,
            replay_buffer_bytes: self.replay_buffer_bytes,
            max_image_decodes: self.max_image_decodes,
            channel_capacity,
            workspaces: self.workspace_roots(),
        }
    }

    /// Where clients' workspaces may be.
    pub fn workspace_roots(&self) -> engine::validate::cwd::Roots {
        engine::validate::cwd::Roots::new(
            self.allowed_cwds.as_deref(),
            self.home.as_deref(),
            self.default_workspace_root(),
        )
    }

    /// Whether callers must authenticate (a service token, JWTs, or both).
    pub fn has_auth(&self) -> bool {
        self.has_service_token() || self.jwt.jwks.is_some()
    }

    /// Whether a service token is configured.
    pub fn has_service_token(&self) -> bool {
        self.auth_token.as_deref().is_some_and(|t| !t.is_empty())
    }

    /// Whether the gateway may serve on `bound` (the listener's address): without a token only
    /// on loopback, unless `--allow-unauthenticated` says otherwise. The error says what to do.
    pub fn may_serve_on(&self, bound: std::net::SocketAddr) -> Result<(), String> {
        if self.has_auth() || self.allow_unauthenticated || bound.ip().is_loopback() {
            return Ok(());
        }
        Err(format!(
            "Refusing to listen on {bound} without authentication: anyone who reaches it could \
             use the gateway. Set IAC_CODE_AGUI_AUTH_TOKEN (or auth_token in the config file) or \
             --auth-jwks (with --auth-issuer and --auth-audience), listen on a loopback address \
             (--host 127.0.0.1), or pass --allow-unauthenticated \
             (IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED=true) to serve without authentication."
        ))
    }

    /// The bounds of request bodies.
    pub fn body_bounds(&self) -> crate::edge::request_body::Bounds {
        crate::edge::request_body::Bounds {
            deadline: self.body_timeout,
            linger: self.linger_timeout,
            linger_bytes: crate::edge::request_body::LINGER_BYTES,
        }
    }

    /// Timeouts of the kernel client.
    pub fn kernel_timeouts(&self) -> a2a::Timeouts {
        a2a::Timeouts {
            stream_idle: self.kernel_idle_timeout,
            ..a2a::Timeouts::default()
        }
    }
}

/// A secret in `Debug`: whether it is set, never what it is.
struct Hidden(bool);

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 { "Some(***)" } else { "None" })
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every field named, so that a new one is a compile error here until it is shown or
        // hidden.
        let Config {
            host,
            port,
            a2a_urls,
            a2a_token,
            auth_token,
            debug,
            log_stdout,
            state_dir,
            state_dir_is_default,
            idle_shutdown,
            interrupt_ttl_secs,
            a2a_command,
            shutdown_timeout,
            kernel_idle_timeout,
            client_stall_timeout,
            allowed_cwds,
            home,
            fallback_lang,
            cors_origins,
            detach_grace,
            replay_buffer_bytes,
            metrics_listen,
            log_format,
            state_url,
            lease_ttl,
            advertise_url,
            kernel_backup_dir,
            kernel_persistence_dir,
            kernel_env,
            caps,
            max_image_decodes,
            kernels,
            isolation,
            egress,
            config_file,
            body_timeout,
            linger_timeout,
            allowed_hosts,
            allow_unauthenticated,
            console,
            jwt,
            cluster_secret,
            state_ca_file,
            tls,
            metrics_tls,
            cluster_ca,
        } = self;
        f.debug_struct("Config")
            .field("host", host)
            .field("port", port)
            .field("a2a_urls", a2a_urls)
            .field("a2a_token", &Hidden(a2a_token.is_some()))
            .field("auth_token", &Hidden(auth_token.is_some()))
            .field("debug", debug)
            .field("log_stdout", log_stdout)
            .field("state_dir", state_dir)
            .field("state_dir_is_default", state_dir_is_default)
            .field("idle_shutdown", idle_shutdown)
            .field("interrupt_ttl_secs", interrupt_ttl_secs)
            .field("a2a_command", a2a_command)
            .field("shutdown_timeout", shutdown_timeout)
            .field("kernel_idle_timeout", kernel_idle_timeout)
            .field("client_stall_timeout", client_stall_timeout)
            .field("allowed_cwds", allowed_cwds)
            .field("home", home)
            .field("fallback_lang", fallback_lang)
            .field("cors_origins", cors_origins)
            .field("detach_grace", detach_grace)
            .field("replay_buffer_bytes", replay_buffer_bytes)
            .field("metrics_listen", metrics_listen)
            .field("log_format", log_format)
            .field("state_url", &state_url.as_deref().map(urls::redacted))
            .field("lease_ttl", lease_ttl)
            .field("advertise_url", advertise_url)
            .field("kernel_backup_dir", kernel_backup_dir)
            .field("kernel_persistence_dir", kernel_persistence_dir)
            .field("kernel_env", kernel_env)
            .field("caps", caps)
            .field("max_image_decodes", max_image_decodes)
            .field("kernels", kernels)
            .field("isolation", isolation)
            .field("egress", egress)
            .field("config_file", config_file)
            .field("body_timeout", body_timeout)
            .field("linger_timeout", linger_timeout)
            .field("allowed_hosts", allowed_hosts)
            .field("allow_unauthenticated", allow_unauthenticated)
            .field("console", console)
            .field("jwt", jwt)
            .field("cluster_secret", &Hidden(cluster_secret.is_some()))
            .field("state_ca_file", state_ca_file)
            .field("tls", tls)
            .field("metrics_tls", metrics_tls)
            .field("cluster_ca", cluster_ca)
            .finish()
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
            ("client_stall_timeout", "IAC_CODE_AGUI_CLIENT_STALL_TIMEOUT"),
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
            ("kernel_env", "IAC_CODE_AGUI_KERNEL_ENV"),
            ("max_connections", "IAC_CODE_AGUI_MAX_CONNECTIONS"),
            ("max_runs", "IAC_CODE_AGUI_MAX_RUNS"),
            ("max_runs_per_user", "IAC_CODE_AGUI_MAX_RUNS_PER_USER"),
            ("max_detached_runs", "IAC_CODE_AGUI_MAX_DETACHED_RUNS"),
            ("max_readers_per_run", "IAC_CODE_AGUI_MAX_READERS_PER_RUN"),
            (
                "max_guidance_per_thread",
                "IAC_CODE_AGUI_MAX_GUIDANCE_PER_THREAD",
            ),
            ("transcript_limit", "IAC_CODE_AGUI_TRANSCRIPT_LIMIT"),
            ("max_image_decodes", "IAC_CODE_AGUI_MAX_IMAGE_DECODES"),
            ("kernels", "IAC_CODE_AGUI_KERNELS"),
            ("body_timeout", "IAC_CODE_AGUI_BODY_TIMEOUT"),
            ("linger_timeout", "IAC_CODE_AGUI_LINGER_TIMEOUT"),
            ("allowed_host", "IAC_CODE_AGUI_ALLOWED_HOSTS"),
            (
                "allow_unauthenticated",
                "IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED",
            ),
            ("console", "IAC_CODE_AGUI_CONSOLE"),
            ("auth_jwks", "IAC_CODE_AGUI_AUTH_JWKS"),
            ("auth_issuer", "IAC_CODE_AGUI_AUTH_ISSUER"),
            ("auth_audience", "IAC_CODE_AGUI_AUTH_AUDIENCE"),
            ("auth_user_claim", "IAC_CODE_AGUI_AUTH_USER_CLAIM"),
            ("auth_jwks_refresh", "IAC_CODE_AGUI_AUTH_JWKS_REFRESH"),
            ("state_ca_file", "IAC_CODE_AGUI_STATE_CA_FILE"),
            ("tls_cert", "IAC_CODE_AGUI_TLS_CERT"),
            ("tls_key", "IAC_CODE_AGUI_TLS_KEY"),
            ("metrics_tls_cert", "IAC_CODE_AGUI_METRICS_TLS_CERT"),
            ("metrics_tls_key", "IAC_CODE_AGUI_METRICS_TLS_KEY"),
            ("cluster_ca", "IAC_CODE_AGUI_CLUSTER_CA"),
        ] {
            assert_eq!(var(id).as_deref(), Some(name), "{id}");
        }
        // The reference has no variable for these.
        assert_eq!(var("idle_shutdown"), None);
        assert_eq!(var("config"), None);
    }

    #[test]
    fn a_tls_pair_comes_whole_and_makes_the_advertised_url_https() {
        let e = load(&["--tls-cert", "/c.pem"], &[]).unwrap_err();
        assert_eq!(e, "--tls-cert and --tls-key must be given together.");
        let e = load(&["--metrics-tls-key", "/k.pem"], &[]).unwrap_err();
        assert!(
            e.contains("--metrics-tls-cert and --metrics-tls-key"),
            "{e}"
        );
        let c = load(&["--tls-cert", "/c.pem", "--tls-key", "/k.pem"], &[]).unwrap();
        let pair = c.tls.unwrap();
        assert_eq!(
            (pair.cert.to_str(), pair.key.to_str()),
            (Some("/c.pem"), Some("/k.pem"))
        );
        assert_eq!(c.advertise_url, "https://127.0.0.1:8000/");
        assert!(load(&[], &[]).unwrap().tls.is_none());
    }

    #[test]
    fn a_cluster_secret_has_32_characters_and_is_never_shown() {
        assert_eq!(load(&[], &[]).unwrap().cluster_secret, None);
        let short = load(&[], &[("IAC_CODE_AGUI_CLUSTER_SECRET", "too-short")]).unwrap_err();
        assert!(short.contains("at least 32 characters"), "{short}");
        let secret = "s".repeat(32);
        let c = load(&[], &[("IAC_CODE_AGUI_CLUSTER_SECRET", &secret)]).unwrap();
        assert_eq!(c.cluster_secret.as_deref(), Some(secret.as_str()));
        let shown = format!("{c:?}");
        assert!(shown.contains("cluster_secret: Some(***)") && !shown.contains(&secret));
    }

    #[test]
    fn kernel_env_from_flags_or_yaml_never_the_gateways_own() {
        assert!(load(&[], &[]).unwrap().kernel_env.is_empty());
        let c = load(&["--kernel-env", "A", "--kernel-env", "B,C"], &[]).unwrap();
        assert_eq!(c.kernel_env, ["A", "B", "C"]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, "kernel-env: [ALIBABA_CLOUD_ACCESS_KEY_ID]\n").unwrap();
        let p = p.display().to_string();
        let c = load(&["--config", &p], &[]).unwrap();
        assert_eq!(c.kernel_env, ["ALIBABA_CLOUD_ACCESS_KEY_ID"]);
        let err = load(&["--kernel-env", "IAC_CODE_AGUI_AUTH_TOKEN"], &[]).unwrap_err();
        assert!(
            err.starts_with("--kernel-env cannot pass IAC_CODE_AGUI_AUTH_TOKEN"),
            "{err}"
        );
        std::fs::write(&p, "kernel_env: [1]\n").unwrap();
        assert_eq!(load(&["--config", &p], &[]).unwrap_err(), check::KERNEL_ENV);
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
    fn client_stall_timeout_from_each_layer_and_never_zero() {
        assert_eq!(
            load(&[], &[]).unwrap().client_stall_timeout,
            Duration::from_secs(60)
        );
        let c = load(&["--client-stall-timeout", "2.5"], &[]).unwrap();
        assert_eq!(c.client_stall_timeout, Duration::from_millis(2500));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, "client-stall-timeout: 7\n").unwrap();
        let c = load(&["--config", p.to_str().unwrap()], &[]).unwrap();
        assert_eq!(c.client_stall_timeout, Duration::from_secs(7));
        for bad in ["0", "-1", "x", "inf"] {
            assert_eq!(
                load(&["--client-stall-timeout", bad], &[]).unwrap_err(),
                "--client-stall-timeout must be a positive number of seconds.",
                "{bad}"
            );
        }
    }

    #[test]
    fn kernels_from_each_layer_auto_and_bounded() {
        assert_eq!(load(&[], &[]).unwrap().kernels, 1);
        assert_eq!(load(&["--kernels", "3"], &[]).unwrap().kernels, 3);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        for (yaml, n) in [("kernels: 4\n", Some(4)), ("kernels: auto\n", None)] {
            std::fs::write(&p, yaml).unwrap();
            let c = load(&["--config", p.to_str().unwrap()], &[]).unwrap();
            let auto = load(&["--kernels", "auto"], &[]).unwrap().kernels;
            assert_eq!(c.kernels, n.unwrap_or(auto), "{yaml}");
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let auto = load(&["--kernels", "auto"], &[]).unwrap().kernels;
        assert!((1..=cores.min(64)).contains(&auto), "{auto}");
        for bad in ["0", "-1", "1.5", "x", "65", "Auto"] {
            assert_eq!(
                load(&["--kernels", bad], &[]).unwrap_err(),
                "--kernels must be an integer between 1 and 64, or auto.",
                "{bad}"
            );
        }
        std::fs::write(&p, "kernels: [2]\n").unwrap();
        assert!(load(&["--config", p.to_str().unwrap()], &[]).is_err());
        let external = ["--a2a-url", "http://127.0.0.1:9/", "--kernels"];
        let e = load(&[&external[..], &["2"]].concat(), &[]).unwrap_err();
        assert_eq!(
            e,
            "--kernels above 1 needs managed kernels: it cannot be used with --a2a-url."
        );
        assert_eq!(
            load(&[&external[..], &["auto"]].concat(), &[])
                .unwrap()
                .kernels,
            1
        );
        assert_eq!(
            load(&[&external[..], &["1"]].concat(), &[])
                .unwrap()
                .kernels,
            1
        );
    }

    /// Several external kernels: the flag repeated or given a comma-separated list, the
    /// variable's list, a YAML list or string; each URL checked, none twice.
    #[test]
    fn several_kernel_urls_from_each_layer() {
        let (a, b) = ("http://127.0.0.1:1/", "http://[::1]:2/");
        let urls = |args: &[&str], env: &[(&str, &str)]| load(args, env).map(|c| c.a2a_urls);
        assert_eq!(urls(&[], &[]), Ok(vec![]));
        assert_eq!(
            urls(&["--a2a-url", a, "--a2a-url", b], &[]),
            Ok(vec![a.into(), b.into()])
        );
        assert_eq!(
            urls(&["--a2a-url", "http://127.0.0.1:1, http://[::1]:2"], &[]),
            Ok(vec![a.into(), b.into()])
        );
        let var = "http://127.0.0.1:1,http://[::1]:2/";
        assert_eq!(
            urls(&[], &[("IAC_CODE_AGUI_A2A_URL", var)]),
            Ok(vec![a.into(), b.into()])
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        let path = p.to_str().unwrap();
        for yaml in [
            "a2a_url: [\"http://127.0.0.1:1\", \"http://[::1]:2\"]\n",
            "a2a-url: http://127.0.0.1:1,http://[::1]:2\n",
        ] {
            std::fs::write(&p, yaml).unwrap();
            assert_eq!(
                urls(&["--config", path], &[]),
                Ok(vec![a.into(), b.into()]),
                "{yaml}"
            );
        }
        // The flag wins over the YAML list, whole.
        assert_eq!(
            urls(&["--config", path, "--a2a-url", b], &[]),
            Ok(vec![b.into()])
        );
        for bad in ["a2a_url: 5\n", "a2a_url: [\"http://127.0.0.1:1\", 5]\n"] {
            std::fs::write(&p, bad).unwrap();
            assert_eq!(
                urls(&["--config", path], &[]).unwrap_err(),
                "--a2a-url must be a string.",
                "{bad}"
            );
        }
        assert_eq!(
            urls(&["--a2a-url", a, "--a2a-url", "http://example.com/"], &[]).unwrap_err(),
            check::LOOPBACK
        );
        assert_eq!(
            urls(&["--a2a-url", a, "--a2a-url", "http://127.0.0.1:1"], &[]).unwrap_err(),
            "--a2a-url names one kernel twice."
        );
        // A blank variable is refused, as one blank URL is.
        assert_eq!(
            urls(&[], &[("IAC_CODE_AGUI_A2A_URL", " , ")]).unwrap_err(),
            check::LOOPBACK
        );
        let e = load(&["--a2a-url", a, "--a2a-url", b, "--kernels", "2"], &[]).unwrap_err();
        assert_eq!(
            e,
            "--kernels above 1 needs managed kernels: it cannot be used with --a2a-url."
        );
    }

    #[test]
    fn the_console_is_off_unless_a_layer_asks_for_it() {
        let at = |args: &[&str], env: &[(&str, &str)]| load(args, env).map(|c| c.console);
        assert_eq!(at(&[], &[]), Ok(Served::Off));
        assert_eq!(at(&["--console"], &[]), Ok(Served::Main));
        assert_eq!(at(&["--console", "--port", "1"], &[]), Ok(Served::Main));
        let admin = ["--console", "admin", "--metrics-listen", "127.0.0.1:0"];
        assert_eq!(at(&admin, &[]), Ok(Served::Admin));
        assert_eq!(at(&["--console=off"], &[]), Ok(Served::Off));
        for (text, want) in [
            ("console: true\n", Served::Main),
            ("console: false\n", Served::Off),
            ("console: main\n", Served::Main),
            ("console: \"yes\"\n", Served::Main),
        ] {
            let f = yaml(text);
            let got = at(&["--config", f.path().to_str().unwrap()], &[]);
            assert_eq!(got, Ok(want), "{text}");
        }
        for bad in ["console: maybe\n", "console: 2\n"] {
            let f = yaml(bad);
            assert_eq!(
                at(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
                "--console must be main, admin or off."
            );
        }
        assert_eq!(
            at(&["--console", "admin"], &[]).unwrap_err(),
            "--console admin needs --metrics-listen: the console is served on the admin listener."
        );
    }

    /// `auto`: a kernel a core, as many as the memory holds.
    #[test]
    fn auto_kernels_are_bounded_by_cores_and_memory() {
        let gib = 1u64 << 30;
        let auto = Some(layers::Counted::Auto);
        assert_eq!(check::kernels(auto, false, 8, Some(64 * gib)), Ok(8));
        assert_eq!(check::kernels(auto, false, 8, Some(gib + 1)), Ok(2));
        assert_eq!(check::kernels(auto, false, 8, Some(gib / 4)), Ok(1));
        assert_eq!(check::kernels(auto, false, 256, None), Ok(64));
        assert_eq!(check::kernels(auto, false, 0, None), Ok(1));
    }

    #[test]
    fn max_image_decodes_from_each_layer_and_bounded() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(load(&[], &[]).unwrap().max_image_decodes, cores);
        let c = load(&["--max-image-decodes", "3"], &[]).unwrap();
        assert_eq!(c.max_image_decodes, 3);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, "max-image-decodes: 7\n").unwrap();
        let c = load(&["--config", p.to_str().unwrap()], &[]).unwrap();
        assert_eq!(c.max_image_decodes, 7);
        for bad in ["0", "-1", "1.5", "x", "1025"] {
            assert_eq!(
                load(&["--max-image-decodes", bad], &[]).unwrap_err(),
                "--max-image-decodes must be an integer between 1 and 1024.",
                "{bad}"
            );
        }
    }

    #[test]
    fn the_default_workspace_root_is_private_to_the_state_dir() {
        let c = load(&["--state-dir", "/data/s"], &[]).unwrap();
        assert_eq!(
            c.default_workspace_root(),
            PathBuf::from("/data/s/workspaces")
        );
    }

    #[test]
    fn body_and_linger_timeouts_from_each_layer() {
        let c = load(&[], &[]).unwrap();
        assert_eq!(
            (c.body_timeout, c.linger_timeout),
            (Duration::from_secs(60), Duration::from_secs(10))
        );
        assert_eq!(
            c.body_bounds().linger_bytes,
            crate::edge::request_body::LINGER_BYTES
        );
        let c = load(&["--body-timeout", "2.5", "--linger-timeout", "0"], &[]).unwrap();
        assert_eq!(
            (c.body_timeout, c.linger_timeout),
            (Duration::from_millis(2500), Duration::ZERO)
        );
        let f = yaml(
            "body-timeout: 7
linger_timeout: 3
",
        );
        let c = load(&["--config", f.path().to_str().unwrap()], &[]).unwrap();
        assert_eq!(
            (c.body_timeout, c.linger_timeout),
            (Duration::from_secs(7), Duration::from_secs(3))
        );
        for bad in ["0", "-1", "x", "inf"] {
            assert_eq!(
                load(&["--body-timeout", bad], &[]).unwrap_err(),
                "--body-timeout must be a positive number of seconds.",
                "{bad}"
            );
        }
        for bad in ["-1", "x"] {
            assert_eq!(
                load(&["--linger-timeout", bad], &[]).unwrap_err(),
                "--linger-timeout must be a non-negative number."
            );
        }
    }

    #[test]
    fn allowed_hosts_from_flags_the_variable_or_yaml() {
        let c = load(&[], &[]).unwrap();
        assert!(c.allowed_hosts.allows_value("localhost:8000"));
        assert!(!c.allowed_hosts.allows_value("agui.example.com"));
        let c = load(
            &[
                "--allowed-host",
                "agui.example.com",
                "--allowed-host",
                ".corp.example,b.test",
            ],
            &[],
        )
        .unwrap();
        for ok in ["agui.example.com", "x.corp.example", "b.test:1"] {
            assert!(c.allowed_hosts.allows_value(ok), "{ok}");
        }
        let f = yaml("allowed-hosts: [\"y.test\"]\n");
        let c = load(&["--config", f.path().to_str().unwrap()], &[]).unwrap();
        assert!(c.allowed_hosts.allows_value("y.test"));
        let f = yaml("allowed_hosts: \"*\"\n");
        let c = load(&["--config", f.path().to_str().unwrap()], &[]).unwrap();
        assert!(c.allowed_hosts.any());
        // The bind host and the advertised host are allowed.
        let c = load(
            &[
                "--host",
                "gw.internal",
                "--advertise-url",
                "http://gw-1.pods:8000",
            ],
            &[],
        )
        .unwrap();
        assert!(c.allowed_hosts.allows_value("gw.internal:8000"));
        assert!(c.allowed_hosts.allows_value("gw-1.pods:8000"));
        for bad in ["agui.example.com:8000", "http://a.test"] {
            assert_eq!(
                load(&["--allowed-host", bad], &[]).unwrap_err(),
                crate::edge::hosts::INVALID
            );
        }
        let f = yaml("allowed_hosts: 5\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            crate::edge::hosts::INVALID
        );
    }

    #[test]
    fn no_token_on_a_non_loopback_address_needs_saying_so() {
        let addr = |a: &str| a.parse::<std::net::SocketAddr>().unwrap();
        let c = load(&["--host", "0.0.0.0"], &[]).unwrap();
        assert!(!c.allow_unauthenticated);
        let err = c.may_serve_on(addr("0.0.0.0:8000")).unwrap_err();
        assert!(
            err.starts_with("Refusing to listen on 0.0.0.0:8000 without authentication"),
            "{err}"
        );
        assert!(err.contains("--allow-unauthenticated"), "{err}");
        assert!(c.may_serve_on(addr("10.0.0.5:8000")).is_err());
        for loopback in ["127.0.0.1:8000", "127.0.0.2:1", "[::1]:8000"] {
            assert_eq!(c.may_serve_on(addr(loopback)), Ok(()), "{loopback}");
        }
        let token = [("IAC_CODE_AGUI_AUTH_TOKEN", "t")];
        let c = load(&["--host", "0.0.0.0"], &token).unwrap();
        assert_eq!(c.may_serve_on(addr("0.0.0.0:8000")), Ok(()));
        let c = load(&["--host", "0.0.0.0", "--allow-unauthenticated"], &[]).unwrap();
        assert_eq!(c.may_serve_on(addr("0.0.0.0:8000")), Ok(()));
        let f = yaml("allow-unauthenticated: true\n");
        let c = load(&["--config", f.path().to_str().unwrap()], &[]).unwrap();
        assert!(c.allow_unauthenticated);
        let f = yaml("allow_unauthenticated: \"yes\"\n");
        assert_eq!(
            load(&["--config", f.path().to_str().unwrap()], &[]).unwrap_err(),
            "allow_unauthenticated must be a boolean."
        );
    }

    #[test]
    fn detach_grace_and_replay_buffer() {
        let c = load(&[], &[]).unwrap();
        assert_eq!(
            (c.detach_grace, c.replay_buffer_bytes),
            (Duration::ZERO, 1048576)
        );
        let c = load(&["--detach-grace", "30", "--replay-buffer", "4096"], &[]).unwrap();
        assert_eq!(
            (c.detach_grace, c.replay_buffer_bytes),
            (Duration::from_secs(30), 4096)
        );
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, "detach-grace: 2.5\nreplay_buffer: 100\n").unwrap();
        let c = load(&["--config", p.to_str().unwrap()], &[]).unwrap();
        assert_eq!(
            (c.detach_grace, c.replay_buffer_bytes),
            (Duration::from_millis(2500), 100)
        );
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
        assert_eq!(
            load(&[], &[]).unwrap().kernel_idle_timeout,
            Duration::from_secs(60)
        );
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
        assert_eq!(c.kernel_idle_timeout, Duration::from_secs(7));
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
        assert_eq!(c.lease_ttl, Duration::from_secs(15));
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
        assert_eq!(c.lease_ttl, Duration::from_secs(3));
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
                "--advertise-url must be an http:// URL (https:// when the listener serves TLS).",
            ),
            (
                &["--advertise-url", "nope"][..],
                "--advertise-url must be an http:// URL (https:// when the listener serves TLS).",
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
        assert_eq!(c.a2a_urls, ["http://127.0.0.1:1234/"]);
        assert_eq!(c.auth_token.as_deref(), Some("t"));
        let c = load(&["--config", p], &[("IAC_CODE_AGUI_AUTH_TOKEN", "e")]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("e"));
        // An empty token variable counts as unset: the YAML token stays.
        let c = load(&["--config", p], &[("IAC_CODE_AGUI_AUTH_TOKEN", "")]).unwrap();
        assert_eq!(c.auth_token.as_deref(), Some("t"));
        // An empty URL flag consults the variable again.
        let c = load(
            &["--a2a-url", ""],
            &[("IAC_CODE_AGUI_A2A_URL", "http://localhost:7/")],
        )
        .unwrap();
        assert_eq!(c.a2a_urls, ["http://localhost:7/"]);
        assert_eq!(load(&[], &[]).unwrap().port, 8000);
        assert_eq!(load(&[], &[]).unwrap().interrupt_ttl_secs, 86400);
    }

    /// Durations beyond about 31 years are that long: a deadline or a date computed from them
    /// never overflows (an interrupt TTL of 1e16 s used to wrap into the past).
    #[test]
    fn huge_durations_are_capped() {
        let c = load(
            &[
                "--interrupt-ttl",
                "10000000000000000",
                "--shutdown-timeout",
                "1e300",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.interrupt_ttl_secs, 1_000_000_000);
        assert_eq!(c.shutdown_timeout.as_secs(), 1_000_000_000);
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
            assert_eq!(validate_a2a_url(bad).unwrap_err(), check::LOOPBACK, "{bad}");
        }
        for (url, kept) in [
            ("http://[::1]:1/", "http://[::1]:1/"),
            ("http://LOCALHOST:1", "http://LOCALHOST:1/"),
            ("http://127.0.0.1:9/x//", "http://127.0.0.1:9/x/"),
        ] {
            assert_eq!(validate_a2a_url(url).unwrap(), kept, "{url}");
        }
        // Loopback, but TLS the kernel client does not speak: refused, saying why.
        for tls in [
            "https://127.0.0.1:9/",
            "HTTPS://localhost:9",
            "https://[::1]:9",
        ] {
            assert_eq!(
                validate_a2a_url(tls).unwrap_err(),
                check::A2A_HTTPS,
                "{tls}"
            );
        }
    }

    #[test]
    fn debug_shows_no_secret() {
        let c = load(
            &[
                "--state-url",
                "postgres://agui:pw-s3cret@127.0.0.1:5432/agui",
            ],
            &[
                ("IAC_CODE_AGUI_AUTH_TOKEN", "auth-s3cret"),
                ("IAC_CODE_AGUI_A2A_TOKEN", "kernel-s3cret"),
            ],
        )
        .unwrap();
        for shown in [format!("{c:?}"), format!("{c:#?}")] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(
                shown.contains("postgres://agui:***@127.0.0.1:5432/agui"),
                "{shown}"
            );
        }
        let shown = format!("{c:?}");
        assert!(shown.contains("auth_token: Some(***)"), "{shown}");
        assert!(shown.contains("a2a_token: Some(***)"), "{shown}");
        let shown = format!("{:?}", load(&[], &[]).unwrap());
        assert!(shown.contains("auth_token: None, "), "{shown}");
        assert!(shown.contains("state_url: None, "), "{shown}");
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
