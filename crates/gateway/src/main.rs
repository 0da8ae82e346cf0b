//! `iac-code-agui`: drop-in replacement for `iac-code agui`.

use std::sync::Arc;

use clap::Parser;
use iac_code_agui::app;
use iac_code_agui::config::isolation::Mode;
use iac_code_agui::config::Env;
use iac_code_agui::config::{Cli, Config};
use iac_code_agui::telemetry::{self, Metrics};

/// SIGTERM and SIGINT, caught from the moment this is made: made before the listener is bound,
/// so a process manager that stops a gateway just started gets a drain and status 0, never the
/// signal's default action (an exit with no flush and the kernel left to its parent-death
/// signal).
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn catch() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// The first of them, however long ago it came.
    async fn received(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        tracing::info!("shutdown requested");
    }
}

/// Closes this process to every other process of its user: its `/proc/<pid>/environ`, `mem` and
/// the like, and ptrace. The managed kernel runs tools an LLM chooses as the same user, and the
/// gateway's environment holds its secrets (the service token, the cluster secret, the
/// database's password) and its memory the callers' keys. Core dumps go with it. A child gets
/// its own flag back at `execve`, so the kernel is not affected.
fn close_to_own_user() {
    #[allow(unsafe_code)]
    // SAFETY: prctl with integer arguments only; it changes a flag of this process.
    let failed = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0;
    if failed {
        eprintln!(
            "warning: the process could not be closed to its own user (prctl PR_SET_DUMPABLE): {}",
            std::io::Error::last_os_error()
        );
    }
}

fn main() {
    close_to_own_user();
    let cli = Cli::parse();
    // The environment is read once: the process never changes it afterwards.
    let vars: std::collections::HashMap<String, String> = std::env::vars().collect();
    let env: Env = Arc::new(move |k: &str| vars.get(k).cloned());
    let cfg = match Config::load(cli, &*env) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    };
    if cfg.state_dir_is_default {
        if let Some(parent) = cfg.state_dir.parent() {
            if !parent.exists() {
                use std::os::unix::fs::DirBuilderExt;
                let _ = std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent);
            }
        }
    }
    // Without configured roots, workspaces live in a private directory of the state dir.
    match engine::validate::cwd::ensure_default_root(&cfg.workspace_roots()) {
        Ok(_) => {}
        Err(e) => {
            eprintln!(
                "Unable to create the workspace root {}: {e}",
                cfg.default_workspace_root().display()
            );
            std::process::exit(1);
        }
    }
    // Users' own kernels: refused where they could not be confined as promised.
    if let Err(e) = iac_code_agui::tenancy::check(&cfg, &env) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(async move {
        let signals = match StopSignals::catch() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("Unable to catch SIGTERM and SIGINT: {e}");
                return 1;
            }
        };
        // Logging (and the trace exporter, which runs on this runtime) first.
        let metrics = Arc::new(Metrics::new());
        // The client of what leaves the cluster: trace exports and the JWT key set.
        let outbound = iac_code_agui::outbound::Outbound::public(&*env);
        let telemetry = telemetry::init(&cfg, &env, metrics.clone(), &outbound);
        // Room for the descriptors the bounds allow (said in the log when there is too little).
        let files = engine::limits::make_room_for_descriptors(&cfg.caps);
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = match app::bind(&addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("Unable to listen on {addr}: {e}");
                return 1;
            }
        };
        // Without a token, only loopback unless the operator says otherwise.
        let served = match listener.local_addr() {
            Ok(a) => cfg.may_serve_on(a),
            Err(e) => Err(format!("Unable to listen on {addr}: {e}")),
        };
        if let Err(e) = served {
            eprintln!("{e}");
            return 1;
        }
        // A certificate that cannot be served stops the start, naming the file.
        for pair in [&cfg.tls, &cfg.metrics_tls].into_iter().flatten() {
            if let Err(e) = tls::Reloading::load(&pair.cert, &pair.key) {
                eprintln!("{e}");
                return 1;
            }
        }
        let admin = match cfg.metrics_listen.as_deref() {
            None => None,
            Some(a) => match app::bind(a).await {
                Ok(l) => Some(l),
                Err(e) => {
                    eprintln!("Unable to listen on {a} (--metrics-listen): {e}");
                    return 1;
                }
            },
        };
        // A start may wait minutes for another instance's migration: a stop meanwhile ends it
        // (nothing is served yet; an unfinished migration rolls back with its connection).
        let mut signals = Box::pin(signals.received());
        let store = tokio::select! {
            opened = app::open_store(&cfg) => match opened {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{e}");
                    return 1;
                }
            },
            () = &mut signals => return 0,
        };
        let auth = match iac_code_agui::auth::Auth::open(&cfg, &outbound).await {
            Ok(a) => Arc::new(a),
            Err(e) => {
                eprintln!("{e}");
                return 1;
            }
        };
        // The LLM egress before the kernels, which are started with its capabilities.
        let egress = match cfg.egress.as_ref() {
            None => None,
            Some(o) => match iac_code_agui::egress::Egress::start(o, &*env, metrics.clone()) {
                Ok(e) => Some(e),
                Err(e) => {
                    eprintln!("{e}");
                    return 1;
                }
            },
        };
        iac_code_agui::tenancy::say_where_the_llm_key_is(&cfg, &env);
        let mut opts = app::Options::new(cfg, env);
        opts.egress = egress;
        opts.store = Some(store);
        opts.metrics = Some(metrics);
        opts.auth = Some(auth);
        opts.outbound = Some(outbound);
        let state = app::build(opts);
        if let Some(a) = admin.as_ref().and_then(|l| l.local_addr().ok()) {
            tracing::info!(addr = %a, "metrics listening");
        }
        tracing::info!(%addr, open_file_limit = files, "iac-code-agui listening");
        let isolated = state.cfg.isolation.mode == Mode::User;
        if isolated {
            tracing::info!(
                kernels = state.cfg.kernels,
                idle_stop_s = state.cfg.isolation.idle_stop.as_secs(),
                "kernel isolation: each user's runs in a kernel of their own, confined by Landlock"
            );
        }
        if state.cfg.allowed_cwds.is_none() {
            let root = state.cfg.default_workspace_root();
            tracing::info!(root = %root.display(), "workspaces: under the default root (IAC_CODE_AGUI_ALLOWED_CWDS sets others)");
        }
        if !state.auth.required() {
            // No token, no key set: whoever reaches the listener may use every route.
            let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
            if loopback {
                tracing::info!(%addr, "authentication is off (no IAC_CODE_AGUI_AUTH_TOKEN, no --auth-jwks): one user; any local process may use the gateway and every thread");
            } else {
                tracing::warn!(%addr, "authentication is off (no IAC_CODE_AGUI_AUTH_TOKEN, no --auth-jwks) on a non-loopback address (--allow-unauthenticated): anyone who reaches it may use the gateway and every thread");
            }
        } else {
            let how = state.auth.describe();
            tracing::info!(%addr, "authentication: {how}; a caller with a user reaches only that user's threads");
            if state.cfg.jwt.jwks.is_some() && !isolated {
                iac_code_agui::auth::shared_kernels_warning("JWTs name users");
            }
        }
        // A managed kernel runs its tools with the gateway's uid.
        if state.cfg.a2a_urls.is_empty() && iac_code_agui::tenancy::is_root() && !isolated {
            tracing::warn!("the gateway runs as root, and so does its managed kernel: the agent's shell and file tools act as root on this machine; run the gateway as an unprivileged user");
        }
        let code = match app::serve_with_admin(listener, admin, state, signals).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("server error: {e}");
                1
            }
        };
        telemetry.shutdown().await;
        code
    });
    std::process::exit(code);
}
