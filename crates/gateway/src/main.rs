//! `iac-code-agui`: drop-in replacement for `iac-code agui`.

use std::sync::Arc;

use clap::Parser;
use iac_code_agui::app;
use iac_code_agui::config::{Cli, Config};
use iac_code_agui::run::Env;

fn init_logging(cfg: &Config) {
    let level = if cfg.debug { "debug" } else { "info" };
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("IAC_CODE_AGUI_LOG").unwrap_or_else(|_| {
            tracing_subscriber::EnvFilter::new(format!("iac_code_agui={level},a2a={level},warn"))
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    if cfg.log_stdout {
        builder.with_writer(std::io::stdout).init();
    } else {
        builder.with_writer(std::io::stderr).init();
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutdown requested");
}

fn main() {
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
    init_logging(&cfg);
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(async move {
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = match app::bind(&addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("Unable to listen on {addr}: {e}");
                return 1;
            }
        };
        let store = match app::open_store(&cfg) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "Unable to open the state directory {}: {e}",
                    cfg.state_dir.display()
                );
                return 1;
            }
        };
        let mut opts = app::Options::new(cfg, env);
        opts.store = Some(store);
        let state = app::build(opts);
        tracing::info!(%addr, "iac-code-agui listening");
        match app::serve(listener, state, shutdown_signal()).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("server error: {e}");
                1
            }
        }
    });
    std::process::exit(code);
}
