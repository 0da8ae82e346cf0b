//! `TestServer`: the gateway on 127.0.0.1:0 with a temp state dir, in front of a fake or real kernel.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clock::Clock;
use iac_code_agui::api::AppState;
use iac_code_agui::app::{self, Options};
use iac_code_agui::config::{Caps, Config, Env};
use kernel::{ChildSpec, Kernel, KernelState};
use serde_json::{json, Value};
use store::{BoxFuture, Documents, Store, StoreError, ThreadDoc};
use testkit::fake_kernel::{FakeKernel, Item, Reply, Stream};
use testkit::real_kernel::KernelEnv;
use testkit::sse::{post, RunResult};
use tokio::sync::oneshot;

pub use testkit::free_port;

pub struct Builder {
    pub env: Vec<(String, String)>,
    pub auth: Option<String>,
    pub kernel: Option<Arc<Kernel>>,
    pub a2a: Option<(String, Option<String>)>,
    pub console: iac_code_agui::config::Served,
    pub heartbeat: Duration,
    pub store: Option<Store>,
    pub clock: Option<Arc<dyn Clock>>,
    pub dir: Option<PathBuf>,
    pub channel_capacity: usize,
    pub cors: Vec<String>,
    /// Open the admin listener (`/metrics`, `/health`).
    pub admin: bool,
    pub allowed_hosts: Vec<String>,
    /// Accept JWTs of `testkit::jwt`'s keys: the key set's file (written by `jwt`), and how
    /// often it is read again.
    pub jwks: Option<(PathBuf, Duration)>,
    /// Serve TLS with this certificate and key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Changes to the configuration, made in order after the builder's own settings.
    configure: Vec<ConfigHook>,
}

/// A change to the gateway's configuration ([`Builder::config`]).
type ConfigHook = Box<dyn FnOnce(&mut Config) + Send>;

pub struct TestServer {
    pub url: String,
    /// The admin listener's URL, when the builder asked for one.
    pub admin_url: Option<String>,
    pub state: AppState,
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            env: vec![],
            auth: None,
            kernel: None,
            a2a: None,
            console: iac_code_agui::config::Served::Off,
            heartbeat: Duration::from_secs(15),
            store: None,
            clock: None,
            dir: None,
            channel_capacity: 64,
            cors: vec![],
            admin: false,
            allowed_hosts: vec![],
            jwks: None,
            tls: None,
            configure: vec![],
        }
    }
    /// Sets anything of the gateway's configuration the builder has no setting for (a bound, a
    /// timeout, the replay buffer, …), as its command-line flag or variable would.
    pub fn config(mut self, f: impl FnOnce(&mut Config) + Send + 'static) -> Self {
        self.configure.push(Box::new(f));
        self
    }
    /// The bounds on concurrent work: the defaults, as `f` changes them.
    pub fn caps(self, f: impl FnOnce(&mut Caps) + Send + 'static) -> Self {
        self.config(move |c| {
            c.caps = Caps::default();
            f(&mut c.caps);
        })
    }
    /// Opens the admin listener too (`--metrics-listen`).
    pub fn admin(mut self) -> Self {
        self.admin = true;
        self
    }
    /// A host requests without a token may name (`--allowed-host`).
    pub fn allowed_host(mut self, name: &str) -> Self {
        self.allowed_hosts.push(name.into());
        self
    }
    /// Allows pages of `origin` to call the gateway (`--cors-origin`).
    pub fn cors_origin(mut self, origin: &str) -> Self {
        self.cors.push(origin.into());
        self
    }
    pub fn auth(mut self, t: &str) -> Self {
        self.auth = Some(t.into());
        self
    }
    /// Serves https with the certificate and key at these paths (the URL stays `http://`: the
    /// test says `https://` itself).
    pub fn tls(mut self, cert: &std::path::Path, key: &std::path::Path) -> Self {
        self.tls = Some((cert.to_owned(), key.to_owned()));
        self
    }
    /// Accepts JWTs checked against the key set at `jwks` (see [`jwks_file`]), issued by
    /// `testkit::jwt::ISSUER` for `testkit::jwt::AUDIENCE`, the set read again every `refresh`.
    pub fn jwks(mut self, jwks: &std::path::Path, refresh: Duration) -> Self {
        self.jwks = Some((jwks.to_owned(), refresh));
        self
    }
    /// A gateway in front of the fake kernel `k` (without an A2A token).
    pub fn for_fake(k: &FakeKernel) -> Builder {
        Builder::new().a2a(&k.url(), None)
    }
    /// A kernel URL nothing listens on (the discard port), for tests that never reach a kernel.
    pub fn kernel_unreachable(self) -> Self {
        self.a2a("http://127.0.0.1:9/", None)
    }
    /// A gateway of the real kernel's environment `env`: its state under the test's directory,
    /// its workspaces the allowed roots.
    pub fn in_env(env: &KernelEnv) -> Builder {
        Builder::new()
            .dir(env.dir.path().canonicalize().unwrap())
            .env(
                "IAC_CODE_AGUI_ALLOWED_CWDS",
                &env.ws().display().to_string(),
            )
    }

    /// `--console` (on the main listener).
    pub fn console(mut self) -> Self {
        self.console = iac_code_agui::config::Served::Main;
        self
    }
    /// `--console admin` (with [`Builder::admin`]).
    pub fn console_on_admin(mut self) -> Self {
        self.console = iac_code_agui::config::Served::Admin;
        self.admin = true;
        self
    }
    pub fn a2a(mut self, url: &str, token: Option<&str>) -> Self {
        self.a2a = Some((url.into(), token.map(str::to_owned)));
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }
    pub fn kernel(mut self, k: Arc<Kernel>) -> Self {
        self.kernel = Some(k);
        self
    }
    pub fn heartbeat(mut self, d: Duration) -> Self {
        self.heartbeat = d;
        self
    }
    /// A store of documents only (no history, no other instance), as a test wraps one.
    pub fn store(mut self, s: Arc<dyn Documents>) -> Self {
        self.store = Some(Store::documents_only(s));
        self
    }
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = Some(c);
        self
    }
    /// Reuse a directory (state in `<dir>/state`, workspaces in `<dir>/ws`): restarts.
    pub fn dir(mut self, d: PathBuf) -> Self {
        self.dir = Some(d);
        self
    }

    pub async fn start(self) -> TestServer {
        // `AGUI_TEST_LOG=iac_code_agui=debug,a2a=debug` shows the gateway's logs in a test.
        if let Ok(filter) = std::env::var("AGUI_TEST_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_test_writer()
                .try_init();
        }
        let (tmp, dir) = match self.dir {
            Some(d) => (None, d),
            None => {
                let t = tempfile::tempdir().expect("tempdir");
                let d = t.path().canonicalize().expect("canonical");
                (Some(t), d)
            }
        };
        std::fs::create_dir_all(dir.join("ws")).expect("ws");
        let mut vars = vec![("HOME".to_owned(), dir.display().to_string())];
        if !self
            .env
            .iter()
            .any(|(k, _)| k == "IAC_CODE_AGUI_ALLOWED_CWDS")
        {
            vars.push((
                "IAC_CODE_AGUI_ALLOWED_CWDS".into(),
                dir.join("ws").display().to_string(),
            ));
        }
        vars.extend(self.env.clone());
        let vars2 = vars.clone();
        let env: Env = Arc::new(move |k: &str| {
            vars2
                .iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        });
        let mut cfg = Config::for_state_dir(dir.join("state"), &*env);
        cfg.auth_token = self.auth.clone();
        cfg.tls = self
            .tls
            .as_ref()
            .map(|(cert, key)| iac_code_agui::config::TlsPair {
                cert: cert.clone(),
                key: key.clone(),
            });
        if let Some((path, refresh)) = &self.jwks {
            cfg.jwt.jwks = Some(path.display().to_string());
            cfg.jwt.issuer = Some(testkit::jwt::ISSUER.into());
            cfg.jwt.audience = Some(testkit::jwt::AUDIENCE.into());
            cfg.jwt.jwks_refresh = *refresh;
        }
        if let Some((url, token)) = &self.a2a {
            // Several kernels: their URLs separated by commas.
            cfg.a2a_urls = (url.split(','))
                .map(|u| iac_code_agui::config::validate_a2a_url(u).expect("loopback url"))
                .collect();
            cfg.a2a_token = token.clone();
        }
        cfg.console = self.console;
        for f in self.configure {
            f(&mut cfg);
        }
        cfg.allowed_hosts = iac_code_agui::edge::hosts::AllowedHosts::new(
            &self.allowed_hosts,
            &cfg.host,
            &cfg.advertise_url,
        )
        .expect("valid allowed hosts");
        cfg.cors_origins =
            iac_code_agui::edge::cors::Origins::parse(&self.cors).expect("valid CORS origins");
        let mut opts = Options::new(cfg, env);
        opts.heartbeat = self.heartbeat;
        opts.store = self.store;
        opts.clock = self.clock;
        opts.kernel = self.kernel;
        opts.channel_capacity = self.channel_capacity;
        if self.jwks.is_some() {
            let outbound = iac_code_agui::outbound::Outbound::public(&*opts.env);
            let auth = iac_code_agui::auth::Auth::open(&opts.cfg, &outbound)
                .await
                .expect("key set");
            opts.auth = Some(Arc::new(auth));
            opts.outbound = Some(outbound);
        }
        let state = app::build(opts);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let admin = match self.admin {
            true => Some(
                tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind admin"),
            ),
            false => None,
        };
        let admin_url = admin
            .as_ref()
            .map(|l| format!("http://{}/", l.local_addr().expect("admin addr")));
        let (tx, rx) = oneshot::channel::<()>();
        let st = state.clone();
        let task = tokio::spawn(async move {
            let _ = app::serve_with_admin(listener, admin, st, async move {
                let _ = rx.await;
            })
            .await;
        });
        TestServer {
            url: format!("http://{addr}/"),
            admin_url,
            state,
            dir,
            _tmp: tmp,
            stop: Some(tx),
            task: Some(task),
        }
    }
}

impl TestServer {
    pub fn ws(&self, name: &str) -> String {
        self.dir.join("ws").join(name).display().to_string()
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    /// The thread's state file, with every save so far written to it (the store journals saves
    /// and writes the files at checkpoints).
    pub fn thread_file(&self, thread: &str) -> PathBuf {
        let store = self.state.rt.threads().store().clone();
        // Blocking here: callers are tests' async code on a multi-threaded runtime, or sync.
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
                .block_on(store.documents().flush())
        })
        .join()
        .expect("flush thread")
        .expect("state checkpoint");
        let stem = store::file_stem(thread).expect("stem");
        self.state_dir()
            .join("threads")
            .join(format!("{stem}.json"))
    }
    pub fn thread_doc(&self, thread: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.thread_file(thread)).expect("state file"))
            .expect("json")
    }
    pub fn cancel_url(&self, exec: &str) -> String {
        format!(
            "{}extensions/iac-code/v1/executions/{exec}/cancel",
            self.url
        )
    }
    /// The id of `thread`'s current execution, from its state file.
    pub fn execution_id(&self, thread: &str) -> String {
        self.thread_doc(thread)["execution"]["executionId"]
            .as_str()
            .expect("an execution")
            .to_owned()
    }
    /// Asks the cancellation extension to cancel `exec` of `thread` (`rosInvocationId` `ros`).
    pub async fn cancel(&self, exec: &str, thread: &str, ros: &str) -> RunResult {
        let b = json!({"threadId": thread, "rosInvocationId": ros});
        post(&self.cancel_url(exec), &b, &[]).await
    }
    /// Stops the server (graceful) and waits for it; the state dir stays.
    pub async fn stop(mut self) -> PathBuf {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
        }
        let tmp = self._tmp.take();
        let dir = self.dir.clone();
        std::mem::forget(tmp); // keep the directory for a restart
        dir
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A fake kernel and a gateway in front of it that sends it the A2A token `a2a-secret`.
pub async fn fake_gateway() -> (TestServer, FakeKernel) {
    let k = FakeKernel::start().await;
    let s = Builder::new()
        .a2a(&k.url(), Some("a2a-secret"))
        .start()
        .await;
    (s, k)
}

/// A gateway in front of the fake kernel `k` whose runs go on for `grace` without a client
/// (`--detach-grace`).
pub async fn detaching_gateway(k: &FakeKernel, grace: Duration) -> TestServer {
    Builder::for_fake(k)
        .config(move |c| c.detach_grace = grace)
        .start()
        .await
}

/// A fake kernel and a gateway in front of it with the bounds on concurrent work `f` sets, whose
/// runs go on for `grace` without a client (`--detach-grace`; zero: none, the default).
pub async fn capped_gateway(
    grace: Duration,
    f: impl FnOnce(&mut Caps) + Send + 'static,
) -> (TestServer, FakeKernel) {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .config(move |c| c.detach_grace = grace)
        .caps(f)
        .start()
        .await;
    (s, k)
}

/// A gateway that asks for the service token `token`, in front of no kernel: for what it
/// answers before a run would reach one.
pub async fn locked_gateway(token: &str) -> TestServer {
    Builder::new()
        .auth(token)
        .kernel_unreachable()
        .start()
        .await
}

/// A minimal valid RunAgentInput.
pub fn body(thread: &str, run: &str, msg: &str, cwd: &str, props: Value) -> Value {
    let mut iac = json!({"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": cwd});
    if let Some(p) = props.as_object() {
        for (k, v) in p {
            iac[k] = v.clone();
        }
    }
    json!({"threadId": thread, "runId": run, "state": {}, "messages": [{"id": format!("msg-{run}"), "role": "user", "content": msg}],
           "tools": [], "context": [], "forwardedProps": {"iacCode": iac}})
}

/// An active-guidance run's body: `msg` steers the thread's running pipeline.
pub fn guidance_body(thread: &str, run: &str, msg: &str, cwd: &str) -> Value {
    body(
        thread,
        run,
        msg,
        cwd,
        json!({"runMode": "pipeline", "activeGuidance": true}),
    )
}

/// A resume body answering `entries`.
pub fn resume_body(thread: &str, run: &str, cwd: &str, ros: &str, entries: Value) -> Value {
    json!({"threadId": thread, "runId": run, "state": {}, "messages": [], "tools": [], "context": [],
           "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": ros, "cwd": cwd}}, "resume": entries})
}

/// Posts a new turn ([`body`] without extra properties) to `url`: the whole answer.
pub async fn post_turn(url: &str, thread: &str, run: &str, msg: &str, cwd: &str) -> RunResult {
    post_turn_as(url, thread, run, msg, cwd, &[]).await
}

/// [`post_turn`] with request headers (a caller's credentials).
pub async fn post_turn_as(
    url: &str,
    thread: &str,
    run: &str,
    msg: &str,
    cwd: &str,
    headers: &[(&str, &str)],
) -> RunResult {
    post(url, &body(thread, run, msg, cwd, json!({})), headers).await
}

/// Posts a resume ([`resume_body`]) answering `entries` to `url`: the whole answer.
pub async fn post_resume(
    url: &str,
    thread: &str,
    run: &str,
    cwd: &str,
    ros: &str,
    entries: Value,
) -> RunResult {
    post(url, &resume_body(thread, run, cwd, ros, entries), &[]).await
}

/// Waits (at most 5 s) for the kernel's `CancelTask`: it must come, and only once.
pub async fn assert_cancelled_once(k: &FakeKernel) {
    let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    assert_eq!(cancels.len(), 1, "the kernel task was not cancelled once");
}

/// `task-1` of `thread`, working, streams `n` agent texts of 200 bytes, then `end` (a final
/// state, or a stall): more than a client that stops reading lets through.
pub fn flood(thread: &str, n: usize, end: Item) -> Reply {
    let working = Stream::of("task-1", &ctx(thread))
        .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}));
    let chunk = "x".repeat(200);
    (0..n)
        .fold(working, |s, _| s.text(&chunk, "m"))
        .then(end)
        .reply()
}

/// Posts `body` to `url` in a task of its own: a run the test acts on while it goes on.
pub fn spawn_post(url: &str, body: Value) -> tokio::task::JoinHandle<RunResult> {
    let url = url.to_owned();
    tokio::spawn(async move { post(&url, &body, &[]).await })
}

/// A valid one-colour PNG of `width` × `height`, base64 (an image a run may carry).
pub fn png_base64(width: u32, height: u32) -> String {
    use base64::Engine as _;
    let img = image::RgbImage::from_pixel(width, height, image::Rgb([10, 200, 10]));
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut out, image::ImageFormat::Png)
        .unwrap();
    base64::engine::general_purpose::STANDARD.encode(out.into_inner())
}

/// The kernel's permission input `perm-1` (task `task-1`, tool `bash`) on `thread`.
pub fn permission(thread: &str) -> Value {
    json!({"schemaVersion":1.0,"kind":"permission","requestTaskId":"task-1","contextId":ctx(thread),
        "inputId":"perm-1","toolUseId":"tu1","toolName":"bash","prompt":"Run bash?","required":true,
        "options":[{"id":"allow_once","label":"Allow once"},{"id":"deny","label":"Deny"}]})
}

/// `agui-` + sha256(thread)[..40]
pub fn ctx(thread: &str) -> String {
    engine::run::context_id(thread)
}

/// A managed real kernel for `env`, ready (or the test fails).
pub async fn managed(env: &KernelEnv) -> Arc<Kernel> {
    managed_with(env, a2a::Timeouts::default()).await
}

/// A managed real kernel for `env` as users' kernels start by default: forked by a kernel fork
/// server of its own (which the test waits for), confined to the environment's directory, its
/// LLM's port and its own. The kernel was forked (or the test fails).
pub async fn forked(env: &KernelEnv) -> Arc<Kernel> {
    use kernel::confine::Confinement;
    use kernel::zygote::{interpreter_of, ForkServer, ServerSpec};
    let mut launch = env.launch();
    // TMPDIR within what it may write (a user's kernel has its own).
    let tmp = env.dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    launch.env("TMPDIR", tmp.display().to_string());
    let program = PathBuf::from(launch.program());
    let mut confinement = Confinement::runtime(&program);
    confinement.read_write.push(env.dir.path().to_path_buf());
    let llm = url::Url::parse(&env.llm.base_url()).unwrap();
    confinement.connect_ports = vec![llm.port().unwrap()];
    launch.confine(confinement.clone());
    let server = ForkServer::start(ServerSpec {
        python: interpreter_of(&program).expect("the kernel is a Python console script"),
        env: kernel::isolate::zygote_env(launch.vars()),
        identity: None,
        confinement,
    });
    let waiting = server.clone();
    let ready = tokio::task::spawn_blocking(move || waiting.wait_ready(Duration::from_secs(180)))
        .await
        .unwrap();
    assert!(ready, "the kernel fork server is not ready: {server:?}");
    launch.fork_from(server.clone());
    let k = Kernel::managed(
        ChildSpec {
            launch,
            ready_timeout: Duration::from_secs(60),
            timeouts: a2a::Timeouts::default(),
        },
        None,
    );
    let state = k.wait_ready(Duration::from_secs(90)).await;
    assert_eq!(state, KernelState::Ready, "{:?}", k.health());
    assert_eq!(server.counts().0, 1, "the kernel was not forked");
    k
}

/// [`managed`], or [`forked`].
pub async fn real(env: &KernelEnv, forked_kernel: bool) -> Arc<Kernel> {
    if forked_kernel {
        forked(env).await
    } else {
        managed(env).await
    }
}

/// [`managed`] with the kernel client's timeouts.
pub async fn managed_with(env: &KernelEnv, timeouts: a2a::Timeouts) -> Arc<Kernel> {
    let k = Kernel::managed(
        ChildSpec {
            launch: env.launch(),
            ready_timeout: Duration::from_secs(60),
            timeouts,
        },
        None,
    );
    let state = k.wait_ready(Duration::from_secs(90)).await;
    assert_eq!(state, KernelState::Ready, "{:?}", k.health());
    k
}

pub async fn server(env: &KernelEnv, kernel: Arc<Kernel>) -> TestServer {
    Builder::in_env(env).kernel(kernel).start().await
}

/// A gateway in front of the real kernel `kernel` (as [`server`]) that accepts JWTs of the key
/// set at `jwks` (see [`jwks_file`]).
pub async fn jwt_server(
    env: &KernelEnv,
    kernel: Arc<Kernel>,
    jwks: &std::path::Path,
) -> TestServer {
    Builder::in_env(env)
        .kernel(kernel)
        .jwks(jwks, Duration::from_secs(300))
        .start()
        .await
}

/// An HTTP client that ignores the environment's proxy settings (the gateway is on loopback).
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `GET url`: the answer, whatever its status.
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Response {
    client().get(url).send().await.expect("request sent")
}

/// Posts the JSON `body` to `url` with `headers`: the answer, unread (a test that reads the
/// stream itself, or only its head).
pub async fn post_json(url: &str, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut rb = client()
        .post(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    rb.body(body.to_string())
        .send()
        .await
        .expect("request sent")
}

/// `GET url` with `headers`: the status and the JSON body (`null` when it is none).
pub async fn get_as(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut rb = client().get(url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().await.expect("request sent");
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Asserts that `answer` (a status and a JSON body, as [`get_as`] gives them) is a 400
/// `INVALID_INPUT`; `case` names what was asked in a failure.
#[track_caller]
pub fn assert_invalid_input(answer: (u16, Value), case: impl std::fmt::Display) {
    let (status, e) = answer;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (400, Some("INVALID_INPUT")),
        "{case}"
    );
}

/// A client that trusts the test's CA only, and reports the certificate each connection saw
/// ([`presented_cert`]); no idle connection is kept (each request shows a fresh handshake).
pub fn https_client(ca: &testkit::tls::Ca) -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .tls_built_in_root_certs(false)
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// The certificate the server presented to `r`'s connection.
pub fn presented_cert(r: &reqwest::Response) -> Vec<u8> {
    r.extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|i| i.peer_certificate())
        .expect("a TLS connection")
        .to_vec()
}

/// Writes the public key set of `signers` (`testkit::jwt`) to `dir/jwks.json`; its path.
pub fn jwks_file(dir: &std::path::Path, signers: &[&testkit::jwt::Signer]) -> PathBuf {
    let path = dir.join("jwks.json");
    std::fs::write(&path, testkit::jwt::set_json(signers)).expect("key set written");
    path
}

/// A JWT for `user` (ES256, key `ec-1`) valid for an hour.
pub fn jwt_for(user: &str) -> String {
    let mut claims = testkit::jwt::claims_for(user);
    claims["exp"] = (testkit::jwt::now() + 3600).into();
    testkit::jwt::sign(testkit::jwt::ec(), Some("ec-1"), &claims)
}

/// [`jwt_for`] as the `Authorization` header's value.
pub fn bearer_for(user: &str) -> String {
    format!("Bearer {}", jwt_for(user))
}

/// The gateway's binary.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_iac-code-agui")
}

/// The gateway's command listening on `port` with its state in `state_dir` (add the rest).
pub fn gateway_command(port: u16, state_dir: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["--port", &port.to_string()])
        .arg("--state-dir")
        .arg(state_dir);
    cmd
}

/// Spawns the gateway process `cmd` (listening on `port`) and waits up to `limit` for its
/// `/health` to answer 200, or fails the test.
pub fn spawn_healthy(
    cmd: &mut std::process::Command,
    port: u16,
    limit: Duration,
) -> std::process::Child {
    let child = cmd.spawn().unwrap();
    assert!(wait_health(port, limit).is_some());
    child
}

/// Polls `GET /health` on a gateway process until it answers 200; how long that took.
pub fn wait_health(port: u16, limit: Duration) -> Option<Duration> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.starts_with("HTTP/1.1 200") {
                return Some(start.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// A store that fails saves on demand (fault injection for the fail-closed paths).
pub struct FaultyStore {
    inner: Arc<dyn Documents>,
    switch: FaultSwitch,
}

/// Arms a [`FaultyStore`].
#[derive(Clone, Default)]
pub struct FaultSwitch {
    fail: Arc<std::sync::atomic::AtomicU32>,
    skip: Arc<std::sync::atomic::AtomicU32>,
}

impl FaultSwitch {
    /// The next `n` saves fail, after letting `skip` saves succeed.
    pub fn fail_saves(&self, skip: u32, n: u32) {
        use std::sync::atomic::Ordering::SeqCst;
        self.skip.store(skip, SeqCst);
        self.fail.store(n, SeqCst);
    }

    /// Whether this save is to fail.
    fn take(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if self.fail.load(SeqCst) == 0 {
            return false;
        }
        if self
            .skip
            .fetch_update(SeqCst, SeqCst, |s| s.checked_sub(1))
            .is_ok()
        {
            return false;
        }
        self.fail.fetch_sub(1, SeqCst);
        true
    }
}

impl FaultyStore {
    pub fn new(inner: impl Documents) -> (FaultyStore, FaultSwitch) {
        let switch = FaultSwitch::default();
        (
            FaultyStore {
                inner: Arc::new(inner),
                switch: switch.clone(),
            },
            switch,
        )
    }
}

impl Documents for FaultyStore {
    fn load(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        self.inner.load(thread_id)
    }
    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        if self.switch.take() {
            return Box::pin(std::future::ready(Err(StoreError::Io(
                std::io::Error::other("injected save failure"),
            ))));
        }
        self.inner.save(doc)
    }
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        self.inner.flush()
    }
    fn reachable(&self) -> BoxFuture<'static, Result<(), String>> {
        self.inner.reachable()
    }
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        self.inner.pending_interrupts()
    }
}

/// A sample of the server's metrics (`name{labels}` as exposed), 0 when absent.
pub fn metric(s: &TestServer, key: &str) -> f64 {
    s.state
        .metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The Chromium the browser drivers launch; the test fails (never skips) without it, so CI runs
/// it.
pub fn chromium() -> PathBuf {
    let path =
        PathBuf::from(std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()));
    assert!(
        path.is_file(),
        "chromium is not installed ({}): scripts/test.sh installs it (apt-get install chromium)",
        path.display()
    );
    path
}

/// Runs the Node driver `script` (in `cwd`) of headless Chromium with `plan` on its standard
/// input; returns whether it passed and the report it printed last. Chromium is Debian's
/// (`CHROMIUM` or `/usr/bin/chromium`): the test fails, never skips, without it.
pub async fn browser_driver(
    script: &std::path::Path,
    cwd: &std::path::Path,
    plan: &Value,
) -> (bool, Value) {
    let chromium = chromium();
    let env = [("CHROMIUM", chromium.as_os_str())];
    let out = node(&[script.as_os_str()], cwd, &env, &plan.to_string()).await;
    (out.status.success(), last_report(&out, "driver"))
}

/// Runs `node` with `args` in `cwd` with `env` and `input` on its standard input: its output
/// (within 240 s, or the test fails).
pub async fn node(
    args: &[&std::ffi::OsStr],
    cwd: &std::path::Path,
    env: &[(&str, &std::ffi::OsStr)],
    input: &str,
) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("node")
        .args(args)
        .current_dir(cwd)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    tokio::time::timeout(Duration::from_secs(240), child.wait_with_output())
        .await
        .expect("node finished")
        .unwrap()
}

/// The JSON report a Node `what` (driver, runner) printed last; its whole output in the failure
/// when there is none.
pub fn last_report(out: &std::process::Output, what: &str) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.lines().last().unwrap_or("null")).unwrap_or_else(|_| {
        panic!(
            "{what} output: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
