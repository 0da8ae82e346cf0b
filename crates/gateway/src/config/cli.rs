//! The command line (clap: each flag with its environment variable and its help).

use clap::Parser;

/// AG-UI gateway in front of the iac-code A2A execution kernel (drop-in for `iac-code agui`).
#[derive(Debug, Default, Parser)]
#[command(name = "iac-code-agui", version, about, long_about = None)]
pub struct Cli {
    /// YAML configuration file (keys: host, port, a2a_url, debug, log_stdout, state_dir,
    /// idle_shutdown, auth_token, a2a_token, cluster_secret, interrupt_ttl, a2a_command, shutdown_timeout,
    /// kernel_idle_timeout, client_stall_timeout, cors_origins, detach_grace, replay_buffer, metrics_listen,
    /// log_format, state_url, lease_ttl, advertise_url, kernel_backup_dir,
    /// kernel_persistence_dir, kernel_env, max_connections, max_runs, max_runs_per_user, max_detached_runs,
    /// max_readers_per_run, max_guidance_per_thread, transcript_limit, max_image_decodes, kernels, body_timeout,
    /// linger_timeout, allowed_hosts, allow_unauthenticated, auth_jwks, auth_issuer,
    /// auth_audience, auth_user_claim, auth_jwks_refresh, state_ca_file, tls_cert, tls_key,
    /// metrics_tls_cert, metrics_tls_key, cluster_ca, console, kernel_isolation, kernel_idle_stop,
    /// kernel_user, kernel_start, kernel_connect_ports, llm_upstream, llm_upstream_ca, llm_api_key,
    /// llm_max_requests, llm_token_budget, llm_budget_window; dashes or underscores).
    #[arg(long, value_name = "PATH")]
    pub config: Option<String>,
    /// Bind address [default: 127.0.0.1].
    #[arg(long, env = "IAC_CODE_AGUI_HOST")]
    pub host: Option<String>,
    /// Bind port, 1..65535 [default: 8000].
    #[arg(long, env = "IAC_CODE_AGUI_PORT", allow_hyphen_values = true)]
    pub port: Option<String>,
    /// URL of an existing loopback A2A kernel; repeatable (the variable takes a comma-separated
    /// list) for a pool of kernels that share their task and session directories; empty starts
    /// managed `iac-code a2a` children. Their bearer token: env IAC_CODE_AGUI_A2A_TOKEN or YAML
    /// a2a_token.
    #[arg(
        long,
        value_name = "URL",
        env = "IAC_CODE_AGUI_A2A_URL",
        value_delimiter = ','
    )]
    pub a2a_url: Vec<String>,
    /// Debug logging (default: info).
    #[arg(short, long)]
    pub debug: bool,
    /// Write logs to stdout instead of stderr.
    #[arg(long, overrides_with = "no_log_stdout")]
    pub log_stdout: bool,
    /// Write logs to stderr (default).
    #[arg(long, overrides_with = "log_stdout")]
    pub no_log_stdout: bool,
    /// Durable state root [default: <IAC_CODE_CONFIG_DIR or ~/.iac-code>/agui].
    #[arg(long, env = "IAC_CODE_AGUI_STATE_DIR")]
    pub state_dir: Option<String>,
    /// Exit after this many idle seconds (no active run, no loaded pending interrupt); 0 disables.
    #[arg(long, value_name = "SECONDS", allow_hyphen_values = true)]
    pub idle_shutdown: Option<String>,
    /// Interrupt time-to-live in seconds; 0 disables expiry [default: 86400].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_INTERRUPT_TTL",
        allow_hyphen_values = true
    )]
    pub interrupt_ttl: Option<String>,
    /// Command that starts the managed kernel [default: iac-code beside this executable, else on
    /// PATH]. Arguments: a2a --host 127.0.0.1 --port <free> --thinking-exposure all.
    #[arg(long, env = "IAC_CODE_AGUI_A2A_COMMAND")]
    pub a2a_command: Option<String>,
    /// Seconds open streams get to finish after SIGTERM/SIGINT [default: 10].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_SHUTDOWN_TIMEOUT",
        allow_hyphen_values = true
    )]
    pub shutdown_timeout: Option<String>,
    /// Seconds a kernel stream may stay silent (no event, no ping) before the run fails with
    /// A2A_UNAVAILABLE and its task is cancelled; 0 waits forever [default: 60].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_KERNEL_IDLE_TIMEOUT",
        allow_hyphen_values = true
    )]
    pub kernel_idle_timeout: Option<String>,
    /// Seconds a client may read nothing while its events wait (a run's stream or a re-attached
    /// reader) before it is treated as gone, as if it had disconnected [default: 60].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_CLIENT_STALL_TIMEOUT",
        allow_hyphen_values = true
    )]
    pub client_stall_timeout: Option<String>,
    /// An origin whose pages may call the gateway from a browser (CORS), such as
    /// https://app.example.com; repeatable. The variable takes a comma-separated list [default:
    /// none, no CORS headers].
    #[arg(
        long = "cors-origin",
        value_name = "ORIGIN",
        env = "IAC_CODE_AGUI_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origin: Vec<String>,
    /// Seconds a running turn goes on without a client after its connection drops, buffered for
    /// `GET /threads/{threadId}/runs/{runId}/events`; 0 cancels it at once [default: 0].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_DETACH_GRACE",
        allow_hyphen_values = true
    )]
    pub detach_grace: Option<String>,
    /// Bytes of events kept per run for clients that re-attach (with --detach-grace); the oldest
    /// go first [default: 1048576].
    #[arg(
        long,
        value_name = "BYTES",
        env = "IAC_CODE_AGUI_REPLAY_BUFFER",
        allow_hyphen_values = true
    )]
    pub replay_buffer: Option<String>,
    /// Address (HOST:PORT) of an admin listener that serves GET /metrics in the Prometheus text
    /// format, without a token: bind it where only operators reach [default: none, no metrics
    /// listener].
    #[arg(long, value_name = "ADDR", env = "IAC_CODE_AGUI_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Log lines as `text` or `json` (one object per line, with thread, run and execution ids
    /// as fields) [default: text].
    #[arg(long, value_name = "FORMAT", env = "IAC_CODE_AGUI_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// Thread state in PostgreSQL (postgres://user@host:port/db) instead of --state-dir: several
    /// gateways share it, each thread owned by one at a time [default: none, the file store].
    #[arg(long, value_name = "URL", env = "IAC_CODE_AGUI_STATE_URL")]
    pub state_url: Option<String>,
    /// Seconds an instance's heartbeat in PostgreSQL stays valid: another instance takes over
    /// the threads of one silent longer than this (with --state-url) [default: 15].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_LEASE_TTL",
        allow_hyphen_values = true
    )]
    pub lease_ttl: Option<String>,
    /// URL other instances forward this one's threads to (with --state-url) [default: http://
    /// the bound host and port].
    #[arg(long, value_name = "URL", env = "IAC_CODE_AGUI_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// Directory the managed kernel backs its sessions up to (IAC_CODE_CONFIG_BACKUP_DIR), shared
    /// by the instances so that another's kernel can restore them [default: the kernel's own].
    #[arg(long, value_name = "DIR", env = "IAC_CODE_AGUI_KERNEL_BACKUP_DIR")]
    pub kernel_backup_dir: Option<String>,
    /// Directory the managed kernel keeps its A2A tasks in (its persistence_dir), shared by the
    /// instances so that another's kernel finds a task [default: the kernel's own].
    #[arg(long, value_name = "DIR", env = "IAC_CODE_AGUI_KERNEL_PERSISTENCE_DIR")]
    pub kernel_persistence_dir: Option<String>,
    /// A variable of the gateway's environment the managed kernel gets besides the allow-list
    /// (its IAC_CODE_* settings, PATH, HOME, locale, proxies…), such as ALIBABA_CLOUD_ACCESS_KEY_ID;
    /// repeatable. The variable takes a comma-separated list. Never an IAC_CODE_AGUI_* [default:
    /// none].
    #[arg(
        long = "kernel-env",
        value_name = "NAME",
        env = "IAC_CODE_AGUI_KERNEL_ENV",
        value_delimiter = ','
    )]
    pub kernel_env: Vec<String>,
    /// Open client connections on the main listener; beyond, new connections wait in the accept
    /// queue until one closes (the metrics listener is not counted) [default: 4096].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_CONNECTIONS",
        allow_hyphen_values = true
    )]
    pub max_connections: Option<String>,
    /// Runs served at once (detached and guidance runs included); beyond, a new run is answered
    /// 503 TOO_MANY_RUNS with Retry-After [default: 1024].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_RUNS",
        allow_hyphen_values = true
    )]
    pub max_runs: Option<String>,
    /// Runs of one user served at once, within --max-runs (a caller without a user is bounded by
    /// --max-runs alone); beyond, 429 TOO_MANY_USER_RUNS with Retry-After [default: 64].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_RUNS_PER_USER",
        allow_hyphen_values = true
    )]
    pub max_runs_per_user: Option<String>,
    /// Runs going on without a client at once (with --detach-grace); beyond, a client that
    /// leaves cancels its run as without a grace [default: 256].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_DETACHED_RUNS",
        allow_hyphen_values = true
    )]
    pub max_detached_runs: Option<String>,
    /// Readers of one run's events route at once; beyond, 429 TOO_MANY_READERS [default: 8].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_READERS_PER_RUN",
        allow_hyphen_values = true
    )]
    pub max_readers_per_run: Option<String>,
    /// Guidance runs of one thread at once; beyond, 429 TOO_MANY_GUIDANCE_RUNS [default: 4].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_GUIDANCE_PER_THREAD",
        allow_hyphen_values = true
    )]
    pub max_guidance_per_thread: Option<String>,
    /// Messages one thread's transcript keeps; the oldest go first; 0 keeps none [default: 1000].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_TRANSCRIPT_LIMIT",
        allow_hyphen_values = true
    )]
    pub transcript_limit: Option<String>,
    /// Images decoded and scaled down at once, across requests; more wait their turn (decoding
    /// is CPU work) [default: the number of CPU cores].
    #[arg(
        long,
        value_name = "N",
        env = "IAC_CODE_AGUI_MAX_IMAGE_DECODES",
        allow_hyphen_values = true
    )]
    pub max_image_decodes: Option<String>,
    /// Managed kernels, each its own `iac-code a2a` process sharing one task and session store
    /// (a kernel turn uses about one core): a number, or auto (one a core, as many as the
    /// memory holds at 512 MiB each; at most 64) [default: 1].
    #[arg(
        long,
        value_name = "N|auto",
        env = "IAC_CODE_AGUI_KERNELS",
        allow_hyphen_values = true
    )]
    pub kernels: Option<String>,
    /// Whose kernel runs a user's turns: shared (every user's in the same kernels) or user (each
    /// user's in a kernel of their own, at most --kernels alive, confined by Landlock to that
    /// user's workspaces; the gateway refuses to start where Linux cannot enforce it)
    /// [default: shared].
    #[arg(
        long,
        value_name = "shared|user",
        env = "IAC_CODE_AGUI_KERNEL_ISOLATION"
    )]
    pub kernel_isolation: Option<String>,
    /// Seconds a user's own kernel lives without runs before it is stopped; their next run
    /// starts another, which restores their sessions [default: 900].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_KERNEL_IDLE_STOP",
        allow_hyphen_values = true
    )]
    pub kernel_idle_stop: Option<String>,
    /// The numeric UID (and GID) users' own kernels run as; required when the gateway runs as
    /// root with --kernel-isolation user (kernels never run as root) [default: the gateway's].
    #[arg(long, value_name = "UID[:GID]", env = "IAC_CODE_AGUI_KERNEL_USER")]
    pub kernel_user: Option<String>,
    /// A TCP port users' own kernels may connect to (any address); repeatable, or a
    /// comma-separated list [default: 443 and the port of the kernel's IAC_CODE_BASE_URL].
    #[arg(
        long = "kernel-connect-ports",
        value_name = "PORT",
        env = "IAC_CODE_AGUI_KERNEL_CONNECT_PORTS",
        value_delimiter = ','
    )]
    pub kernel_connect_ports: Vec<String>,
    /// How a user's own kernel starts: fork (from the kernel fork server, which imported the
    /// kernel once: about a tenth of a second and a few tens of MiB of its own; spawned while
    /// the fork server starts or is down) or spawn (a new `iac-code a2a` process each time)
    /// [default: fork]. Kernels of --kernel-isolation shared are always spawned.
    #[arg(long, value_name = "fork|spawn", env = "IAC_CODE_AGUI_KERNEL_START")]
    pub kernel_start: Option<String>,
    /// The LLM provider's base URL (what IAC_CODE_BASE_URL would say): the gateway holds the
    /// provider key (IAC_CODE_AGUI_LLM_API_KEY, YAML llm_api_key, else its IAC_CODE_API_KEY) and
    /// managed kernels reach the provider through its loopback endpoint with a capability of
    /// their own instead. Needs IAC_CODE_PROVIDER [default: off, kernels hold the key].
    #[arg(long, value_name = "URL", env = "IAC_CODE_AGUI_LLM_UPSTREAM")]
    pub llm_upstream: Option<String>,
    /// The CA certificates (PEM) the upstream's TLS certificate must chain to [default: the
    /// system's and Mozilla's roots].
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_LLM_UPSTREAM_CA")]
    pub llm_upstream_ca: Option<String>,
    /// The most LLM requests forwarded upstream at once, a user's at most a quarter of them; more
    /// wait their turn up to 30 s, then get 503 [default: 64].
    #[arg(long, value_name = "N", env = "IAC_CODE_AGUI_LLM_MAX_REQUESTS")]
    pub llm_max_requests: Option<String>,
    /// Tokens (input and output) a user may spend through the egress per --llm-budget-window;
    /// past it their runs are refused 429 LLM_BUDGET_EXHAUSTED [default: no budget].
    #[arg(long, value_name = "TOKENS", env = "IAC_CODE_AGUI_LLM_TOKEN_BUDGET")]
    pub llm_token_budget: Option<String>,
    /// The window of --llm-token-budget, in seconds (a sliding one) [default: 86400].
    #[arg(long, value_name = "SECONDS", env = "IAC_CODE_AGUI_LLM_BUDGET_WINDOW")]
    pub llm_budget_window: Option<String>,
    /// Seconds a request body may take to arrive whole after its head; past them the request is
    /// answered 408 BODY_TIMEOUT and the connection closed [default: 60].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_BODY_TIMEOUT",
        allow_hyphen_values = true
    )]
    pub body_timeout: Option<String>,
    /// Seconds a request body left unread by an early answer (401, 413, 415, 421…) is still read
    /// and discarded, at most 32 MiB of it, so that a client still sending gets the answer
    /// instead of a reset connection; 0 closes at once [default: 10].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_LINGER_TIMEOUT",
        allow_hyphen_values = true
    )]
    pub linger_timeout: Option<String>,
    /// A host name requests may carry in `Host` besides localhost, IP addresses, the bind host
    /// and the advertised URL's host (DNS rebinding defence, for requests without a token):
    /// `agui.example.com`, `.example.com` (a domain and its subdomains) or `*` (any);
    /// repeatable. The variable takes a comma-separated list [default: none].
    #[arg(
        long = "allowed-host",
        value_name = "NAME",
        env = "IAC_CODE_AGUI_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_host: Vec<String>,
    /// Serve without a token on a non-loopback address (refused otherwise): anyone who reaches
    /// the address may use the gateway. The variable takes true/1/yes.
    #[arg(
        long,
        env = "IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    pub allow_unauthenticated: bool,
    /// Serve the console, a page to chat, answer interrupts, browse threads and see the raw
    /// frames, at /console/: on the main listener (a bare --console, or main) or on the admin
    /// listener (admin, with --metrics-listen; the gateway's routes are served there too). Its
    /// requests carry the same authentication as any client's [default: off].
    #[arg(
        long,
        value_name = "main|admin|off",
        num_args = 0..=1,
        default_missing_value = "main",
        env = "IAC_CODE_AGUI_CONSOLE"
    )]
    pub console: Option<String>,
    /// The listener's TLS certificate chain (PEM); with --tls-key, the gateway serves https
    /// (read again on SIGHUP and when the files change) [default: plain HTTP].
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_TLS_CERT")]
    pub tls_cert: Option<String>,
    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_TLS_KEY")]
    pub tls_key: Option<String>,
    /// The admin listener's TLS certificate chain (PEM), with --metrics-tls-key.
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_METRICS_TLS_CERT")]
    pub metrics_tls_cert: Option<String>,
    /// The key of --metrics-tls-cert (PEM).
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_METRICS_TLS_KEY")]
    pub metrics_tls_key: Option<String>,
    /// The CA certificates (PEM) the other instances' TLS certificates chain to, for forwards
    /// over https [default: the system's and Mozilla's roots].
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_CLUSTER_CA")]
    pub cluster_ca: Option<String>,
    /// The CA certificates (PEM) the state database's TLS certificate must chain to, with
    /// `sslmode=verify-ca` or `verify-full` in --state-url [default: the system's and Mozilla's
    /// roots].
    #[arg(long, value_name = "PATH", env = "IAC_CODE_AGUI_STATE_CA_FILE")]
    pub state_ca_file: Option<String>,
    /// Accept JWTs signed by these keys: a JWKS file's path, or an http(s) URL serving one. Read
    /// at start-up, again when a token names a key id it does not hold (at most every 10 s) and
    /// every --auth-jwks-refresh seconds. Needs --auth-issuer and --auth-audience
    /// [default: JWTs are not accepted].
    #[arg(long, value_name = "PATH_OR_URL", env = "IAC_CODE_AGUI_AUTH_JWKS")]
    pub auth_jwks: Option<String>,
    /// The issuer (`iss`) a JWT must name.
    #[arg(long, value_name = "ISSUER", env = "IAC_CODE_AGUI_AUTH_ISSUER")]
    pub auth_issuer: Option<String>,
    /// The audience (`aud`) a JWT must name.
    #[arg(long, value_name = "AUDIENCE", env = "IAC_CODE_AGUI_AUTH_AUDIENCE")]
    pub auth_audience: Option<String>,
    /// The JWT claim that names the user [default: sub].
    #[arg(long, value_name = "CLAIM", env = "IAC_CODE_AGUI_AUTH_USER_CLAIM")]
    pub auth_user_claim: Option<String>,
    /// Seconds between two reads of the JWT key set [default: 300].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "IAC_CODE_AGUI_AUTH_JWKS_REFRESH",
        allow_hyphen_values = true
    )]
    pub auth_jwks_refresh: Option<String>,
}

impl Cli {
    /// The flags of the bounds, in `caps::Caps` order.
    pub(super) fn caps_flags(&mut self) -> super::caps::Flags {
        [
            self.max_connections.take(),
            self.max_runs.take(),
            self.max_runs_per_user.take(),
            self.max_detached_runs.take(),
            self.max_readers_per_run.take(),
            self.max_guidance_per_thread.take(),
            self.transcript_limit.take(),
        ]
    }

    /// The flags of the isolation options, in `isolation::Isolation` order.
    pub(super) fn isolation_flags(&mut self) -> super::isolation::Flags {
        (
            self.kernel_isolation.take(),
            self.kernel_idle_stop.take(),
            self.kernel_user.take(),
            std::mem::take(&mut self.kernel_connect_ports),
            self.kernel_start.take(),
        )
    }

    /// The flags of the LLM egress options, in `egress::Flags` order.
    pub(super) fn egress_flags(&mut self) -> super::egress::Flags {
        (
            self.llm_upstream.take(),
            self.llm_upstream_ca.take(),
            self.llm_max_requests.take(),
            self.llm_token_budget.take(),
            self.llm_budget_window.take(),
        )
    }

    /// The flags of the JWT options, in `auth::JwtConfig` order.
    pub(super) fn jwt_flags(&mut self) -> super::auth::Flags {
        [
            self.auth_jwks.take(),
            self.auth_issuer.take(),
            self.auth_audience.take(),
            self.auth_user_claim.take(),
            self.auth_jwks_refresh.take(),
        ]
    }

    /// `--log-stdout` (on) or `--no-log-stdout` (off), whichever came last; `None`: neither.
    pub(super) fn log_stdout_flag(&self) -> Option<bool> {
        if self.log_stdout {
            Some(true)
        } else if self.no_log_stdout {
            Some(false)
        } else {
            None
        }
    }
}
