//! Wiring: runtime construction, serving on a bound listener, idle and graceful shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, AppState};
use crate::config::isolation::Mode;
use crate::config::{Config, Env};
use crate::egress::Egress;
use crate::outbound::Outbound;
use crate::telemetry::observer::KernelObserver;
use crate::telemetry::Metrics;
use crate::tenancy;
use crate::urls;
use clock::{Clock, SystemClock};
use engine::run::Runtime;
use engine::telemetry::Telemetry as _;
use kernel::{ChildSpec, Kernel, Pool};
use store::{FileStore, PgStore, Store, StoreError, Unavailable};

/// Options for building a runtime (tests inject the store, clock and kernel).
pub struct Options {
    pub cfg: Config,
    pub env: Env,
    pub store: Option<Store>,
    pub clock: Option<Arc<dyn Clock>>,
    pub kernel: Option<Arc<Kernel>>,
    pub heartbeat: Duration,
    pub channel_capacity: usize,
    /// The metrics (the binary makes them first: the trace exporter counts into them).
    pub metrics: Option<Arc<Metrics>>,
    /// How callers authenticate, its key set read (the binary opens it first: a key set that
    /// cannot be read stops the start). Without it the key set is read by its timer.
    pub auth: Option<Arc<crate::auth::Auth>>,
    /// The client of requests that leave the cluster (the binary makes it first: the trace
    /// exporter and the key set share it). Without it one is made.
    pub outbound: Option<Outbound>,
    /// The LLM egress, started (the binary starts it first: one that cannot start stops the
    /// start). Without it, one is started when the configuration has it.
    pub egress: Option<Egress>,
}

impl Options {
    pub fn new(cfg: Config, env: Env) -> Options {
        Options {
            cfg,
            env,
            store: None,
            clock: None,
            kernel: None,
            heartbeat: api::HEARTBEAT,
            channel_capacity: 64,
            metrics: None,
            auth: None,
            outbound: None,
            egress: None,
        }
    }
}

/// The kernels of a configuration: the external ones at `--a2a-url`, or `--kernels` managed
/// children (sharing their task and session store, as the kernel keeps them under its
/// configuration directory). Their calls are timed in `metrics` and carry the trace context.
/// With the LLM egress, every managed kernel reaches the provider through it and holds no key.
pub fn pool_for(
    cfg: &Config,
    env: &Env,
    metrics: &Arc<Metrics>,
    egress: Option<&Egress>,
) -> Arc<Pool> {
    let observer = || -> Arc<dyn a2a::Observer> { KernelObserver::new(metrics.clone()) };
    if cfg.isolation.mode == Mode::User {
        let mut isolation = tenancy::isolation(cfg, env);
        if let Some(e) = egress {
            tenancy::through_egress(&mut isolation, e, env);
        }
        isolation.fork = tenancy::fork_server(cfg, env, &isolation);
        let tenants = kernel::Tenants::new(
            cfg.kernels.max(1),
            isolation,
            cfg.isolation.idle_stop,
            Some(observer()),
        );
        return Pool::isolated(tenants);
    }
    let slots = if cfg.a2a_urls.is_empty() {
        (0..cfg.kernels.max(1))
            .map(|_| managed_kernel(cfg, env, observer(), egress))
            .collect()
    } else {
        (cfg.a2a_urls.iter())
            .map(|url| {
                Kernel::external(
                    url,
                    cfg.a2a_token.clone(),
                    cfg.kernel_timeouts(),
                    Some(observer()),
                )
            })
            .collect()
    };
    Pool::new(slots).expect("at least one kernel")
}

/// A managed kernel of a configuration: an `iac-code a2a` child with what the gateway's
/// environment may give it.
fn managed_kernel(
    cfg: &Config,
    env: &Env,
    observer: Arc<dyn a2a::Observer>,
    egress: Option<&Egress>,
) -> Arc<Kernel> {
    let mut launch = tenancy::base_launch(cfg, env);
    if let Some(e) = egress {
        tenancy::without_llm_keys(&mut launch);
        launch.envs(e.kernel_vars(None, &**env));
    }
    if let Some(v) = env("IAC_CODE_AGUI_ALLOWED_CWDS").filter(|v| !v.is_empty()) {
        if env("IACCODE_A2A_ALLOWED_CWDS")
            .filter(|v| !v.is_empty())
            .is_none()
        {
            launch.env("IACCODE_A2A_ALLOWED_CWDS", v);
        }
    } else if cfg.allowed_cwds.is_none() {
        // The kernel checks workspaces against its own roots, by default its process's
        // directory and the temporary one: it gets the gateway's default root instead.
        let root = cfg.default_workspace_root();
        launch.env(
            "IACCODE_A2A_ALLOWED_CWDS",
            root.to_string_lossy().into_owned(),
        );
    }
    // Shared by several instances: the kernel backs its sessions up there, and keeps its
    // tasks there, so that another instance's kernel restores and finds them.
    if let Some(dir) = &cfg.kernel_backup_dir {
        launch.backup_dir(dir);
    }
    if let Some(dir) = &cfg.kernel_persistence_dir {
        if let Err(e) = launch.persistence_dir(dir) {
            tracing::error!(error = %e, "the kernel configuration cannot be written");
        }
    }
    Kernel::managed(
        ChildSpec {
            launch,
            ready_timeout: Duration::from_secs(20),
            timeouts: cfg.kernel_timeouts(),
        },
        Some(observer),
    )
}

/// Binds the listening socket with a deep accept queue: a burst of new streams must not overflow
/// it (an overflowed SYN is retried by the client only after a second). The kernel caps the depth
/// at `net.core.somaxconn`.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let socket = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(a).and_then(|()| socket.listen(4096)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no address to listen on")))
}

/// Opens the gateway's thread store: the PostgreSQL store of `--state-url` (connected, migrated,
/// this instance registered and its heartbeat running), else the file store of `--state-dir`
/// (temporary files of interrupted writes swept, the journal a previous process left replayed).
/// The error says what could not be opened.
pub async fn open_store(cfg: &Config) -> Result<Store, String> {
    if let Some(url) = &cfg.state_url {
        let ca = cfg.state_ca_file.as_deref();
        let store = PgStore::open(url, ca, &cfg.advertise_url, cfg.lease_ttl).await?;
        store.start_heartbeat();
        if urls::parse(&cfg.advertise_url).is_some_and(|u| urls::is_loopback(&u)) {
            tracing::warn!(
                advertise = %cfg.advertise_url,
                "the advertised URL is a loopback address: only instances on this machine can \
                 forward to this one (set --advertise-url)"
            );
        }
        tracing::info!(
            instance = store.instance_id(),
            advertise = %cfg.advertise_url,
            "thread state in PostgreSQL"
        );
        return Ok(Store::pg(store));
    }
    open_file_store(cfg).map_err(|e| {
        format!(
            "Unable to open the state directory {}: {e}",
            cfg.state_dir.display()
        )
    })
}

/// The file store of `--state-dir`.
pub fn open_file_store(cfg: &Config) -> Result<Store, StoreError> {
    Ok(Store::file(FileStore::open(cfg.state_dir.clone())?))
}

/// Builds the runtime and router state.
pub fn build(opts: Options) -> AppState {
    let store = match opts.store {
        Some(s) => s,
        None => open_file_store(&opts.cfg).unwrap_or_else(|e| {
            tracing::error!(error = %e, "the state directory cannot be opened");
            Store::documents_only(Arc::new(Unavailable(e.to_string())))
        }),
    };
    let metrics = opts.metrics.unwrap_or_default();
    let egress = opts.egress.or_else(|| {
        let o = opts.cfg.egress.as_ref()?;
        Some(
            Egress::start(o, &*opts.env, metrics.clone())
                .unwrap_or_else(|e| panic!("the LLM egress cannot start: {e}")),
        )
    });
    let kernels = match opts.kernel {
        Some(k) => Pool::one(k),
        None => pool_for(&opts.cfg, &opts.env, &metrics, egress.as_ref()),
    };
    metrics.watch_kernel(kernels.clone());
    let clock = opts.clock.unwrap_or_else(|| Arc::new(SystemClock));
    let refresh = opts.cfg.jwt.jwks_refresh;
    let outbound = opts
        .outbound
        .unwrap_or_else(|| Outbound::public(&*opts.env));
    let auth = opts
        .auth
        .unwrap_or_else(|| Arc::new(crate::auth::Auth::unread(&opts.cfg, &outbound)));
    // The key set is read again on its timer for as long as the gateway serves.
    auth.spawn_refresh(refresh);
    let settings = opts.cfg.engine_settings(opts.channel_capacity);
    let store = crate::telemetry::metered(store, metrics.clone());
    let rt = Runtime::new(settings, store, kernels, clock, metrics.clone());
    let rt = Arc::new(rt);
    // Interrupts already waiting in the store count before their threads are loaded.
    let counting = rt.clone();
    tokio::spawn(async move { counting.threads().count_stored_interrupts().await });
    let forwarding = Arc::new(crate::forward::Forwarding::new(opts.cfg.cluster_ca.clone()));
    AppState {
        rt,
        cfg: Arc::new(opts.cfg),
        metrics,
        heartbeat: opts.heartbeat,
        auth,
        forwarding,
        card: Default::default(),
        egress,
    }
}

/// A listener's TLS, when configured: its pair read (an error stops the start) and watched.
fn listener_tls(
    pair: Option<&crate::config::TlsPair>,
) -> std::io::Result<Option<tokio_rustls::TlsAcceptor>> {
    let Some(pair) = pair else {
        return Ok(None);
    };
    let reloading = tls::Reloading::load(&pair.cert, &pair.key).map_err(std::io::Error::other)?;
    reloading.spawn_watch();
    reloading
        .acceptor()
        .map(Some)
        .map_err(std::io::Error::other)
}

/// [`serve`], with the admin listener (`/metrics`) on `admin` when given: it answers until the
/// public server has drained, so that a scrape sees the end of the drain.
pub async fn serve_with_admin(
    listener: TcpListener,
    admin: Option<TcpListener>,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (rt, cfg) = (state.rt.clone(), state.cfg.clone());
    let tls = listener_tls(cfg.tls.as_ref())?;
    let admin_tls = listener_tls(cfg.metrics_tls.as_ref())?;
    let (admin_stop, admin_done) = tokio::sync::oneshot::channel::<()>();
    // Several external kernels are probed for placement; one for `agui_kernel_up` when the
    // metrics are served. A managed one is watched anyway.
    rt.kernels().probe_external(admin.is_some());
    let admin_task = admin.map(|l| {
        let router = api::admin::router(state.clone());
        let stall = cfg.client_stall_timeout;
        // Not capped: an operator's probe and scrape still answer when the public listener is
        // full.
        tokio::spawn(crate::edge::server::serve(
            l,
            router,
            stall,
            None,
            admin_tls,
            async move {
                let _ = admin_done.await;
            },
        ))
    });
    let (stop_tx, mut stop_rx) = watch::channel(false);
    // External shutdown signal.
    {
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
    }
    // Idle shutdown: no open stream, no thread held by a run or waiting for answers.
    if !cfg.idle_shutdown.is_zero() {
        let rt = rt.clone();
        let stop_tx = stop_tx.clone();
        let idle = cfg.idle_shutdown.as_secs_f64();
        tokio::spawn(async move {
            let tick = Duration::from_secs_f64((idle / 4.0).clamp(0.1, 5.0));
            loop {
                tokio::time::sleep(tick).await;
                let busy = rt.activity().open_streams() > 0 || rt.threads().busy();
                if busy {
                    rt.touch();
                    continue;
                }
                if rt.activity().idle_ms(rt.now_ms()) as f64 >= idle * 1000.0 {
                    tracing::info!("idle shutdown");
                    let _ = stop_tx.send(true);
                    return;
                }
            }
        });
    }
    let metrics = state.metrics.clone();
    let app = api::router(state);
    let rt2 = rt.clone();
    let stall = cfg.client_stall_timeout;
    let graceful = async move {
        let _ = stop_rx.wait_for(|v| *v).await;
        rt2.shutdown().begin();
    };
    let cap = crate::edge::server::ConnectionCap {
        max: cfg.caps.max_connections,
        on_full: Box::new(move || metrics.limit_reached(crate::telemetry::Limit::Connections)),
    };
    let server = async move {
        crate::edge::server::serve(listener, app, stall, Some(cap), tls, graceful).await;
        Ok::<(), std::io::Error>(())
    };
    // One deadline for the whole drain, from the stop signal: open connections, then runs
    // without a connection (detached), whose last writes (the run's end on the thread) land
    // before the store is flushed. The kernel's own stop (SIGTERM, SIGKILL after 5 s) follows.
    let timeout = cfg.shutdown_timeout + Duration::from_secs(2);
    let drain_deadline = Arc::new(std::sync::OnceLock::new());
    let mut stop_rx2 = stop_tx.subscribe();
    let result = tokio::select! {
        r = server => r,
        _ = {
            let drain_deadline = drain_deadline.clone();
            async move {
                let _ = stop_rx2.wait_for(|v| *v).await;
                let deadline = *drain_deadline.get_or_init(|| tokio::time::Instant::now() + timeout);
                tokio::time::sleep_until(deadline).await;
            }
        } => {
            tracing::warn!("drain deadline passed; closing remaining connections");
            Ok(())
        }
    };
    let runs_deadline = *drain_deadline.get_or_init(|| tokio::time::Instant::now() + timeout);
    while rt.activity().open_streams() > 0 && tokio::time::Instant::now() < runs_deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rt.kernels().stop().await;
    if let Err(e) = rt.threads().store().documents().flush().await {
        tracing::warn!(error = %e, "state journal checkpoint at shutdown failed");
    }
    rt.threads().store().release().await;
    let _ = admin_stop.send(());
    if let Some(t) = admin_task {
        let _ = t.await;
    }
    result
}
