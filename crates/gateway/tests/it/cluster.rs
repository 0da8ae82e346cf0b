//! Several gateway instances on one PostgreSQL (a private cluster per test, `testkit::postgres`):
//! exactly one admission per thread across instances, idempotency across them, forwarding to the
//! holder, takeover of a dead holder's threads, a stopped instance that writes nothing once its
//! lease lapsed, PostgreSQL restarts, and a load of two instances. The real-kernel takeover is
//! `real_kernel_cluster`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Reply, Stream};
use testkit::postgres::{Cluster, Stop};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{
    assert_cancelled_once, bin, body, client, ctx, free_port, post_resume, post_turn, post_turn_as,
    resume_body, spawn_post, wait_health,
};

/// One gateway process on the shared database.
pub struct Instance {
    pub child: Child,
    pub port: u16,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Instance {
    /// Starts an instance in front of `kernel` (`--a2a-url`), or with `args` of its own.
    pub fn start(db: &str, args: &[&str], env: &[(String, String)]) -> Instance {
        let i = Instance::spawn(db, args, env);
        assert!(
            wait_health(i.port, Duration::from_secs(30)).is_some(),
            "instance did not start: {}",
            i.log()
        );
        i
    }

    /// [`Instance::start`] on `port` (an instance started again where another was).
    pub fn start_on(port: u16, db: &str, args: &[&str], env: &[(String, String)]) -> Instance {
        let i = Instance::spawn_on(port, db, args, env);
        assert!(
            wait_health(i.port, Duration::from_secs(30)).is_some(),
            "instance did not start: {}",
            i.log()
        );
        i
    }

    /// [`Instance::start`] without waiting for its plain-HTTP `/health` (an instance serving TLS).
    pub fn spawn(db: &str, args: &[&str], env: &[(String, String)]) -> Instance {
        Instance::spawn_on(free_port(), db, args, env)
    }

    fn spawn_on(port: u16, db: &str, args: &[&str], env: &[(String, String)]) -> Instance {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("gateway.log");
        let mut command = Command::new(bin());
        // No `db`: the database is named by a variable or the YAML file among `args`.
        if !db.is_empty() {
            command.args(["--state-url", db]);
        }
        let child = command
            .args(["--port", &port.to_string()])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(args)
            .envs(env.iter().cloned())
            .env(
                "IAC_CODE_AGUI_LOG",
                "iac_code_agui=debug,kernel=debug,a2a=info,warn",
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Instance {
            child,
            port,
            log,
            _dir: dir,
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    pub fn signal(&self, sig: i32) {
        #[allow(unsafe_code)]
        // SAFETY: plain kill syscall.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A workspace root both instances allow.
pub struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }
    pub fn cwd(&self, name: &str) -> String {
        self.root().join(name).display().to_string()
    }
    pub fn env(&self) -> Vec<(String, String)> {
        vec![(
            "IAC_CODE_AGUI_ALLOWED_CWDS".into(),
            self.root().display().to_string(),
        )]
    }
}

/// A private database, a workspace both instances allow, and two instances, A and B, each in
/// front of a fake kernel of its own, started with `extra` arguments.
struct Pair {
    pg: Cluster,
    ws: Workspace,
    ka: FakeKernel,
    kb: FakeKernel,
    a: Instance,
    b: Instance,
}

async fn pair(db: &str, extra: &[&str]) -> Pair {
    let pg = Cluster::start();
    let url = pg.create_db(db);
    let ws = Workspace::new();
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let args = |k: &FakeKernel| {
        let mut v = vec!["--a2a-url".to_owned(), k.url()];
        v.extend(extra.iter().map(|a| (*a).to_owned()));
        v
    };
    let start = |k: &FakeKernel| {
        let a = args(k);
        Instance::start(
            &url,
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
            &ws.env(),
        )
    };
    let (a, b) = (start(&ka), start(&kb));
    Pair {
        pg,
        ws,
        ka,
        kb,
        a,
        b,
    }
}

/// A turn on the fake kernel: the task, `text`, then `then` (completion by default).
pub(crate) fn turn(k: &FakeKernel, thread: &str, task: &str, text: &str, then: Vec<Item>) {
    let c = ctx(thread);
    let mut items = vec![
        Item::Result(items::task(
            task,
            &c,
            "TASK_STATE_SUBMITTED",
            json!({"iacCodeSessionId": format!("sess-{thread}")}),
        )),
        Item::Result(items::text(task, &c, text, &format!("m-{task}"), json!({}))),
    ];
    if then.is_empty() {
        items.push(Item::Result(items::status(
            task,
            &c,
            "TASK_STATE_INPUT_REQUIRED",
            json!({}),
        )));
    } else {
        items.extend(then);
    }
    k.on_context("SendStreamingMessage", &c, Reply::Sse(items));
}

pub(crate) fn perm(id: &str, thread: &str, task: &str) -> Value {
    json!({"schemaVersion":1,"kind":"permission","requestTaskId":task,"contextId":ctx(thread),"inputId":id,"toolUseId":format!("tu-{id}"),
        "toolName":"bash","prompt":"Run bash?","title":"Run bash","options":[{"id":"allow_once","label":"Allow once"},{"id":"deny","label":"Deny"}],
        "required":true})
}

/// A turn that ends in a permission interrupt.
pub(crate) fn interrupting_turn(k: &FakeKernel, thread: &str, task: &str, input: &str) {
    let c = ctx(thread);
    turn(
        k,
        thread,
        task,
        "Let me run",
        vec![Item::Result(items::status(
            task,
            &c,
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm(input, thread, task)}),
        ))],
    );
}

/// The kernel's side of a resume: the task as it waits, then the answer's stream.
pub(crate) fn accepting_resume(k: &FakeKernel, thread: &str, task: &str, input: &str) {
    let c = ctx(thread);
    k.task_awaits_input(task, &c, json!({"input": perm(input, thread, task)}));
    k.stream(
        Stream::of(task, &c)
            .working(json!({"inputReceived": {"kind": "permission", "inputId": input}}))
            .text("Done.", "m-done")
            .input_required(json!({})),
    );
}

pub(crate) fn allow(input: &str) -> Value {
    json!([{"interruptId": input, "status": "resolved", "payload": {"decision": "allow_once"}}])
}

/// The thread's row: owner, epoch, document.
pub(crate) fn row(pg: &Cluster, db: &str, thread: &str) -> (String, i64, Value) {
    let out = pg.psql(
        db,
        &format!("SELECT owner || '|' || epoch || '|' || coalesce(doc, 'null') FROM agui_threads WHERE thread_id = '{thread}'"),
    );
    let mut parts = out.splitn(3, '|');
    let owner = parts.next().unwrap_or("").to_owned();
    let epoch = parts.next().and_then(|e| e.parse().ok()).unwrap_or(-1);
    let doc = parts
        .next()
        .and_then(|d| serde_json::from_str(d).ok())
        .unwrap_or(Value::Null);
    (owner, epoch, doc)
}

pub(crate) fn instance_ids(pg: &Cluster, db: &str) -> Vec<(String, String)> {
    pg.psql(db, "SELECT id || '|' || advertise_url FROM agui_instances")
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect()
}

pub(crate) fn id_of(pg: &Cluster, db: &str, i: &Instance) -> String {
    instance_ids(pg, db)
        .into_iter()
        .find(|(_, url)| *url == i.url())
        .map(|(id, _)| id)
        .expect("the instance is registered")
}

async fn get_json(url: &str) -> (u16, Value) {
    let c = client();
    let r = c.get(url).send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Two instances, two fake kernels: a thread is served by the instance that holds it, whichever
/// instance the client asks (its requests are forwarded there and the stream relayed); the
/// holder's kernel gets every turn; reading the thread works at either instance; the file of
/// the thread document in the row is the file store's JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_is_served_by_its_holder_whichever_instance_is_asked() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        a,
        b,
    } = pair("forward", &[]).await;
    turn(&ka, "t1", "task-1", "Hello from A", vec![]);
    let r = post_turn(&a.url(), "t1", "r1", "hi", &ws.cwd("t1")).await;
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    let (owner, epoch, doc) = row(&pg, "forward", "t1");
    assert_eq!(owner, id_of(&pg, "forward", &a));
    assert_eq!(epoch, 1);
    assert_eq!(doc["threadId"], "t1");
    assert_eq!(doc["iacCodeSessionId"], "sess-t1");
    // The second turn asked at B runs at A, on A's kernel.
    ka.on_context(
        "SendStreamingMessage",
        &ctx("t1"),
        Stream::of("task-1", &ctx("t1"))
            .working(json!({}))
            .text("Again from A", "m-2")
            .input_required(json!({}))
            .reply(),
    );
    let r2 = post_turn(&b.url(), "t1", "r2", "again", &ws.cwd("t1")).await;
    assert_valid_run(&r2, "t1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    let text = r2.text();
    assert_eq!(text, "Again from A");
    assert_eq!(ka.calls("SendStreamingMessage").len(), 2);
    assert!(
        kb.calls("SendStreamingMessage").is_empty(),
        "B's kernel never saw the thread"
    );
    assert_eq!(
        row(&pg, "forward", "t1").0,
        id_of(&pg, "forward", &a),
        "still A's"
    );
    // Reading the thread back: the same answer at both instances.
    let (sa, ta) = get_json(&format!("{}threads/t1", a.url())).await;
    let (sb, tb) = get_json(&format!("{}threads/t1", b.url())).await;
    assert_eq!((sa, sb), (200, 200));
    assert_eq!(ta, tb);
    assert_eq!(ta["lastRun"]["runId"], "r2");
    // Which instance holds it (the console's strip): A, as each instance's `/health` names itself.
    let holder = id_of(&pg, "forward", &a);
    assert_eq!(ta["heldBy"], holder.as_str(), "{ta}");
    let (_, ha) = get_json(&format!("{}health", a.url())).await;
    let (_, hb) = get_json(&format!("{}health", b.url())).await;
    assert_eq!(ha["instance"], holder.as_str(), "{ha}");
    assert_eq!(hb["instance"], id_of(&pg, "forward", &b).as_str(), "{hb}");
    // The same run id again at B: the holder's idempotency answers.
    let again = post_turn(&b.url(), "t1", "r2", "again", &ws.cwd("t1")).await;
    assert_eq!(again.status, 409);
    assert_eq!(again.error_code(), Some("DUPLICATE_RUN_ID"));
    let other = post_turn(&a.url(), "t1", "r2", "different", &ws.cwd("t1")).await;
    assert_eq!(other.error_code(), Some("RUN_ID_CONFLICT"));
    // A request forwarded to a non-holder (the thread moved meanwhile) is refused, never
    // served from what that instance has, nor forwarded again. Only an instance can mark a
    // request so (the cluster's key is in the database): a client's own mark is no mark, and
    // its request is forwarded to the holder as any other.
    let key = pg.psql("forward", "SELECT forward_key FROM agui_cluster");
    let client = client();
    let marked = |key: &str| {
        client
            .get(format!("{}threads/t1", b.url()))
            .header("x-iac-code-agui-forwarded-by", "someone")
            .header("x-iac-code-agui-forward-key", key.trim())
            .header("x-iac-code-agui-caller", "open")
    };
    assert_eq!(marked(&key).send().await.unwrap().status(), 503);
    let forged = marked("guessed").send().await.unwrap();
    assert_eq!(forged.status(), 200);
    let v: Value = serde_json::from_slice(&forged.bytes().await.unwrap()).unwrap();
    assert_eq!(v["threadId"], "t1");
    // A bad request is refused where it arrives, before any forward.
    let bad = post(&b.url(), &json!({"threadId": "t1"}), &[]).await;
    assert_eq!(bad.status, 400);
}

/// 50 rounds, each a new thread asked at both instances at once (runs that last a while): exactly
/// one of the two is admitted, the other gets THREAD_BUSY from the holder; then the admitted
/// request is idempotent across instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_racing_on_a_thread_admit_exactly_one() {
    // The cluster lives as long as the test (`_pg`, not `..`: that would drop it at once).
    let Pair {
        pg: _pg,
        ws,
        ka,
        kb,
        a,
        b,
    } = pair("race", &[]).await;
    let rounds = 50;
    for k in [&ka, &kb] {
        for i in 0..rounds {
            let t = format!("race-{i}");
            turn(
                k,
                &t,
                &format!("task-{i}"),
                "working",
                vec![
                    Item::Sleep(Duration::from_millis(1500)),
                    Item::Result(items::status(
                        &format!("task-{i}"),
                        &ctx(&t),
                        "TASK_STATE_INPUT_REQUIRED",
                        json!({}),
                    )),
                ],
            );
        }
    }
    let mut tasks = vec![];
    for i in 0..rounds {
        for (n, url) in [(0, a.url()), (1, b.url())] {
            let thread = format!("race-{i}");
            let b = body(
                &thread,
                &format!("run-{n}"),
                "go",
                &ws.cwd(&thread),
                json!({}),
            );
            tasks.push(tokio::spawn(
                async move { (i, n, post(&url, &b, &[]).await) },
            ));
        }
    }
    let mut results: Vec<Vec<(usize, RunResult)>> = (0..rounds).map(|_| vec![]).collect();
    for t in tasks {
        let (i, n, r) = t.await.unwrap();
        results[i].push((n, r));
    }
    for (i, rs) in results.iter().enumerate() {
        let admitted: Vec<&(usize, RunResult)> =
            rs.iter().filter(|(_, r)| r.status == 200).collect();
        assert_eq!(
            admitted.len(),
            1,
            "round {i}: {:?}\nA: {}\nB: {}",
            rs.iter()
                .map(|(n, r)| (n, r.status, r.error_code()))
                .collect::<Vec<_>>(),
            a.log(),
            b.log()
        );
        let (n, won) = admitted[0];
        assert_valid_run(won, &format!("race-{i}"), &format!("run-{n}"));
        let lost = rs.iter().find(|(m, _)| m != n).unwrap();
        assert_eq!(lost.1.status, 409, "round {i}");
        assert_eq!(lost.1.error_code(), Some("THREAD_BUSY"), "round {i}");
    }
    // Idempotency across instances: the admitted request again, at the other instance.
    for (i, rs) in results.iter().enumerate().take(5) {
        let (n, _) = rs.iter().find(|(_, r)| r.status == 200).unwrap();
        let thread = format!("race-{i}");
        let other = if *n == 0 { b.url() } else { a.url() };
        let r = post_turn(&other, &thread, &format!("run-{n}"), "go", &ws.cwd(&thread)).await;
        assert_eq!(
            r.error_code(),
            Some("DUPLICATE_RUN_ID"),
            "round {i}: {:?}",
            r.json
        );
    }
}

/// The holder dies (`kill -9`) with an interrupt pending: once its heartbeat is older than the
/// TTL, the next request for the thread, at another instance, takes it over (a new epoch),
/// restores the session on its kernel and resumes; the answer is applied once, and a replay is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_holders_thread_is_taken_over_by_the_next_request() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        mut a,
        b,
    } = pair("takeover", &["--lease-ttl", "2"]).await;
    interrupting_turn(&ka, "t1", "task-1", "perm-1");
    let r = post_turn(&a.url(), "t1", "r1", "go", &ws.cwd("t1")).await;
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "interrupt", "{}", r.raw);
    let a_id = id_of(&pg, "takeover", &a);
    let b_id = id_of(&pg, "takeover", &b);
    assert_eq!(row(&pg, "takeover", "t1").0, a_id);
    a.kill9();
    // While A's heartbeat is fresh, B forwards (and A is gone: a clear 503, nothing decided).
    let early = post_resume(
        &b.url(),
        "t1",
        "r2",
        &ws.cwd("t1"),
        "inv-1",
        allow("perm-1"),
    )
    .await;
    assert_eq!(early.status, 503, "{}", early.raw);
    assert_eq!(early.error_code(), Some("STATE_UNAVAILABLE"));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    accepting_resume(&kb, "t1", "task-1", "perm-1");
    let r2 = post_resume(
        &b.url(),
        "t1",
        "r2",
        &ws.cwd("t1"),
        "inv-1",
        allow("perm-1"),
    )
    .await;
    assert_valid_run(&r2, "t1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    let (owner, epoch, doc) = row(&pg, "takeover", "t1");
    assert_eq!(owner, b_id);
    assert!(epoch >= 2, "a new epoch: {epoch}");
    assert_eq!(doc["execution"]["pending"], json!({}));
    assert_eq!(doc["appliedResumeDigests"].as_array().unwrap().len(), 1);
    // The transcript is in the shared store: what A's run showed (kept before its terminal
    // event, so A's death lost none of it), then B's.
    let (status, page) =
        crate::support::get_as(&format!("{}threads/t1/messages", b.url()), &[]).await;
    assert_eq!(status, 200, "{page}");
    let kinds: Vec<(String, String)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let m = &e["message"];
            let kind = m["activityType"].as_str().or(m["role"].as_str()).unwrap();
            (e["runId"].as_str().unwrap().to_owned(), kind.to_owned())
        })
        .collect();
    let expected = [
        ("r1", "user"),
        ("r1", "assistant"),
        ("r1", "iac-code.interrupt"),
        ("r2", "iac-code.interrupt-response"),
        ("r2", "assistant"),
    ];
    assert_eq!(
        kinds,
        expected.map(|(r, k)| (r.to_owned(), k.to_owned())),
        "{page}"
    );
    // B's kernel restored the session (the backup is shared) before the answer.
    let restores: Vec<_> = kb
        .requests()
        .into_iter()
        .filter(|r| r.path == "/iac-code/session/ensure-restored")
        .collect();
    assert_eq!(restores[0].body["sessionId"], "sess-t1");
    assert_eq!(
        kb.calls("SendStreamingMessage").len(),
        1,
        "the answer went once"
    );
    // The same answer again: refused, not delivered again.
    let replay = post_resume(
        &b.url(),
        "t1",
        "r3",
        &ws.cwd("t1"),
        "inv-1",
        allow("perm-1"),
    )
    .await;
    assert_eq!(
        replay.last()["code"],
        "RESUME_ALREADY_APPLIED",
        "{}",
        replay.raw
    );
    assert_eq!(kb.calls("SendStreamingMessage").len(), 1);
}

/// A holder stopped (`SIGSTOP`) past the TTL: another instance takes its thread over; once the
/// stopped one continues (`SIGCONT`) it writes nothing more to that thread, and its run ends with
/// one terminal event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_writes_nothing_after_its_lease_lapsed() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        a,
        b,
    } = pair("stopped", &["--lease-ttl", "2"]).await;
    // A's run: a task, text, a long pause (A is stopped in it), more text, the end.
    let c = ctx("t1");
    turn(
        &ka,
        "t1",
        "task-a",
        "before",
        vec![
            Item::Sleep(Duration::from_secs(5)),
            Item::Result(items::text(
                "task-a",
                &c,
                "before after",
                "m-task-a",
                json!({}),
            )),
            Item::Result(items::status(
                "task-a",
                &c,
                "TASK_STATE_INPUT_REQUIRED",
                json!({}),
            )),
        ],
    );
    let run_a = spawn_post(&a.url(), body("t1", "r1", "go", &ws.cwd("t1"), json!({})));
    let start = Instant::now();
    while row(&pg, "stopped", "t1").2["execution"]["taskId"] != "task-a" {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.signal(libc::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // A's lease lapsed: no live instance holds the thread, and reading it takes nothing over.
    let (status, t) = get_json(&format!("{}threads/t1", b.url())).await;
    assert_eq!((status, &t["heldBy"]), (200, &Value::Null), "{t}");
    assert_eq!(row(&pg, "stopped", "t1").0, id_of(&pg, "stopped", &a));
    // B takes the thread over with a new turn (A's task is an orphan to cancel first).
    turn(&kb, "t1", "task-b", "from B", vec![]);
    let r = post_turn(&b.url(), "t1", "r2", "go", &ws.cwd("t1")).await;
    assert_valid_run(&r, "t1", "r2");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    let taken = row(&pg, "stopped", "t1");
    assert_eq!(taken.0, id_of(&pg, "stopped", &b));
    let (_, t) = get_json(&format!("{}threads/t1", b.url())).await;
    assert_eq!(t["heldBy"], taken.0.as_str(), "{t}");
    assert_eq!(taken.2["lastRun"]["runId"], "r2");
    a.signal(libc::SIGCONT);
    let ra = run_a.await.unwrap();
    assert_valid_run(&ra, "t1", "r1");
    assert_eq!(
        ra.last()["type"],
        "RUN_ERROR",
        "A cannot finish a run it no longer holds: {}",
        ra.raw
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        row(&pg, "stopped", "t1"),
        taken,
        "A wrote nothing after it continued"
    );
    // A is alive again (its heartbeat renewed) and forwards the thread to B.
    turn(&kb, "t1", "task-b", "again from B", vec![]);
    let r3 = post_turn(&a.url(), "t1", "r3", "go", &ws.cwd("t1")).await;
    assert_valid_run(&r3, "t1", "r3");
    assert_eq!(r3.last()["outcome"]["type"], "success", "{}", r3.raw);
    assert_eq!(kb.calls("SendStreamingMessage").len(), 2);
}

/// PostgreSQL restarted mid-run (`-m fast`, then `-m immediate`): a run in flight ends with one
/// terminal event (RUN_ERROR with its task cancelled when a save could not be made); admissions
/// while the database is down get 503 `STATE_UNAVAILABLE` within seconds; once it is back, the
/// pool recovers without a restart of the gateway and runs work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_run_fails_closed_and_the_pool_recovers() {
    let pg = Cluster::start();
    let db = pg.create_db("restart");
    let ws = Workspace::new();
    let k = FakeKernel::start().await;
    let a = Instance::start(&db, &["--a2a-url", &k.url()], &ws.env());
    for (round, how) in [Stop::Fast, Stop::Immediate].into_iter().enumerate() {
        let thread = format!("t{round}");
        let c = ctx(&thread);
        let task = format!("task-{round}");
        // The task id comes after the pause: its save falls in the outage.
        k.stream(
            Stream::of(&task, &c)
                .then(Item::Sleep(Duration::from_millis(1500)))
                .submitted(json!({"iacCodeSessionId": "s"}))
                .text("hello", "m")
                .input_required(json!({})),
        );
        let run = spawn_post(
            &a.url(),
            body(&thread, "r1", "go", &ws.cwd(&thread), json!({})),
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        pg.stop(how);
        // Down: a new admission is refused clearly, and soon.
        let t = Instant::now();
        let refused = post_turn(
            &a.url(),
            "down",
            &format!("r{round}"),
            "go",
            &ws.cwd("down"),
        )
        .await;
        assert_eq!(refused.status, 503, "{}", refused.raw);
        assert_eq!(refused.error_code(), Some("STATE_UNAVAILABLE"));
        assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
        let r = run.await.unwrap();
        assert_valid_run(&r, &thread, "r1");
        assert_eq!(r.last()["code"], "STATE_PERSISTENCE_FAILED", "{}", r.raw);
        assert_eq!(
            k.wait_calls("CancelTask", round + 1, Duration::from_secs(10))
                .await
                .len(),
            round + 1,
            "the task of a run that could not save is cancelled"
        );
        pg.start_again();
        // Back: the pool recovers, runs work again.
        let deadline = Instant::now() + Duration::from_secs(20);
        let next = format!("after-{round}");
        loop {
            k.stream(
                Stream::of("task-n", &ctx(&next))
                    .submitted(json!({}))
                    .input_required(json!({})),
            );
            let r = post_turn(
                &a.url(),
                &next,
                &format!("r-{}", deadline.elapsed().as_millis()),
                "go",
                &ws.cwd(&next),
            )
            .await;
            if r.status == 200 {
                assert_valid_run(&r, &next, r.events[0]["runId"].as_str().unwrap());
                assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the pool did not recover: {}",
                r.raw
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Two instances, 200 concurrent runs each (half of them asked at the other instance and
/// forwarded): every stream valid and successful; afterwards no connection, descriptor or
/// database session is left over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_serve_two_hundred_concurrent_runs_each_without_leaks() {
    testkit::raise_fd_limit();
    let Pair {
        pg,
        ws,
        ka,
        kb,
        a,
        b,
    } = pair("load", &[]).await;
    let per = 200;
    // Warm up both (pools, kernels' first connections), then take the baselines.
    for (i, (inst, k)) in [(&a, &ka), (&b, &kb)].into_iter().enumerate() {
        let t = format!("warm-{i}");
        turn(k, &t, "task-w", "w", vec![]);
        let r = post_turn(&inst.url(), &t, "r", "w", &ws.cwd(&t)).await;
        assert_valid_run(&r, &t, "r");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let base = (open_fds(a.child.id()), open_fds(b.child.id()));
    // Each thread's first turn runs where it is asked; every other thread is asked again at the
    // other instance, forwarded to its holder.
    let mut tasks = vec![];
    for (n, (inst, k)) in [(&a, &ka), (&b, &kb)].into_iter().enumerate() {
        for i in 0..per {
            let t = format!("load-{n}-{i}");
            turn(k, &t, &format!("task-{n}-{i}"), "hello", vec![]);
            let (url, b) = (inst.url(), body(&t, "r1", "go", &ws.cwd(&t), json!({})));
            tasks.push(tokio::spawn(async move { (t, post(&url, &b, &[]).await) }));
        }
    }
    for t in tasks {
        let (thread, r) = t.await.unwrap();
        assert_valid_run(&r, &thread, "r1");
        assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    }
    let mut tasks = vec![];
    for (n, (other, k)) in [(&b, &ka), (&a, &kb)].into_iter().enumerate() {
        for i in (0..per).step_by(2) {
            let t = format!("load-{n}-{i}");
            let task = format!("task-{n}-{i}");
            k.on_context(
                "SendStreamingMessage",
                &ctx(&t),
                Stream::of(&task, &ctx(&t))
                    .working(json!({}))
                    .input_required(json!({}))
                    .reply(),
            );
            let (url, b) = (other.url(), body(&t, "r2", "again", &ws.cwd(&t), json!({})));
            tasks.push(tokio::spawn(async move { (t, post(&url, &b, &[]).await) }));
        }
    }
    for t in tasks {
        let (thread, r) = t.await.unwrap();
        assert_valid_run(&r, &thread, "r2");
        assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = (open_fds(a.child.id()), open_fds(b.child.id()));
        // The kernels' and the database's pools keep a few idle connections, and the forwards'
        // at most 8 to the peer, whose ends the peer holds too.
        let margin = 40 + 2 * 8;
        if now.0 <= base.0 + margin && now.1 <= base.1 + margin {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "descriptors left over: {base:?} -> {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sessions: usize = pg
        .psql(
            "load",
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'iac-code-agui'",
        )
        .parse()
        .unwrap();
    // Each instance: a pool of 16 and 2 for heartbeats.
    assert!(sessions <= 36, "database sessions: {sessions}");
    let rows: usize = pg
        .psql(
            "load",
            "SELECT count(*) FROM agui_threads WHERE doc IS NOT NULL",
        )
        .parse()
        .unwrap();
    assert_eq!(rows, 2 * per + 2);
    // The list, walked a page at a time at either instance, has each thread once, newest
    // activity first (many share a millisecond: the cursor keeps the database's microseconds).
    let mut seen = Vec::new();
    let mut cursor = String::new();
    for page in 0.. {
        let inst = if page % 2 == 0 { &a } else { &b };
        let url = format!("{}threads?limit=37{cursor}", inst.url());
        let (status, p) = crate::support::get_as(&url, &[]).await;
        assert_eq!(status, 200, "{p}");
        for t in p["threads"].as_array().unwrap() {
            seen.push((
                t["lastActivityAt"].as_str().unwrap().to_owned(),
                t["threadId"].as_str().unwrap().to_owned(),
            ));
        }
        match p.get("nextCursor").and_then(Value::as_str) {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 2 * per + 2);
    let unique: std::collections::HashSet<&String> = seen.iter().map(|s| &s.1).collect();
    assert_eq!(unique.len(), seen.len());
    assert!(
        seen.windows(2).all(|w| w[0].0 >= w[1].0),
        "not newest first"
    );
}

/// An answer on its way when its holder died: the holder marked it before sending it, its
/// kernel took it (the task moved on), and the holder was killed before it could record it. The
/// instance that takes the thread over sees the mark and the task, records the answer as
/// applied and does not send it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_on_its_way_when_its_holder_died_is_settled_not_sent_again() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        mut a,
        b,
    } = pair("onitsway", &["--lease-ttl", "2"]).await;
    interrupting_turn(&ka, "t1", "task-1", "perm-1");
    let r = post_turn(&a.url(), "t1", "r1", "go", &ws.cwd("t1")).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt", "{}", r.raw);
    // A's kernel takes the answer and says nothing yet; A dies in between.
    let c = ctx("t1");
    ka.task_awaits_input(
        "task-1",
        &c,
        json!({"input": perm("perm-1", "t1", "task-1")}),
    );
    ka.on("SendStreamingMessage", Reply::Sse(vec![Item::Stall]));
    let dying = spawn_post(
        &a.url(),
        resume_body("t1", "r2", &ws.cwd("t1"), "inv-1", allow("perm-1")),
    );
    let start = Instant::now();
    while ka.calls("SendStreamingMessage").len() < 2 {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let marked = row(&pg, "onitsway", "t1").2;
    assert_eq!(
        marked["deliveringAnswers"][0]["interruptId"], "perm-1",
        "marked before it was sent: {marked}"
    );
    a.kill9();
    let _ = dying.await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // B's kernel (shared task store) shows the task finished with the answer.
    for _ in 0..2 {
        kb.on(
            "GetTask",
            Reply::task("task-1", &c, "TASK_STATE_COMPLETED", json!({})),
        );
    }
    let r2 = post_resume(
        &b.url(),
        "t1",
        "r3",
        &ws.cwd("t1"),
        "inv-1",
        allow("perm-1"),
    )
    .await;
    assert_valid_run(&r2, "t1", "r3");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    assert!(
        kb.calls("SendStreamingMessage").is_empty(),
        "the answer was not sent again"
    );
    let (owner, _, doc) = row(&pg, "onitsway", "t1");
    assert_eq!(owner, id_of(&pg, "onitsway", &b));
    assert_eq!(doc["appliedResumeDigests"][0]["interruptId"], "perm-1");
    assert!(doc.get("deliveringAnswers").is_none(), "{doc}");
    assert_eq!(doc["execution"]["pending"], json!({}));
}

/// The cancellation extension and a run's events, asked at the instance that does not hold the
/// thread: forwarded to the holder (a cancel that stops the run there; the events replayed from
/// its buffer, with `--detach-grace`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_events_reach_the_holder() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        a,
        b,
    } = pair("cancelfwd", &["--detach-grace", "10"]).await;
    turn(&ka, "t1", "task-1", "working", vec![Item::Stall]);
    let run = spawn_post(&a.url(), body("t1", "r1", "go", &ws.cwd("t1"), json!({})));
    let start = Instant::now();
    let exec = loop {
        let doc = row(&pg, "cancelfwd", "t1").2;
        if doc["execution"]["taskId"] == "task-1" {
            break doc["execution"]["executionId"].as_str().unwrap().to_owned();
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let cancel = client()
        .post(format!(
            "{}extensions/iac-code/v1/executions/{exec}/cancel",
            b.url()
        ))
        .header("content-type", "application/json")
        .body(json!({"threadId": "t1", "rosInvocationId": "inv-1"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    let answer: Value = serde_json::from_slice(&cancel.bytes().await.unwrap()).unwrap();
    assert_eq!(answer["status"], "cancelled");
    let r = run.await.unwrap();
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(r.last()["code"], "CANCELLED", "{}", r.raw);
    assert_eq!(
        ka.calls("CancelTask")[0].body["params"]["id"],
        "task-1",
        "A's kernel cancelled it"
    );
    assert!(kb.calls("CancelTask").is_empty());
    // The run's events, from A's buffer, asked at B.
    let c2 = client();
    let replay = c2
        .get(format!("{}threads/t1/runs/r1/events?after=0", b.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 200);
    let text = String::from_utf8(replay.bytes().await.unwrap().to_vec()).unwrap();
    assert_eq!(text, r.raw, "the same events, byte for byte");
}

/// The observer extension asked at the instance that does not hold the thread: forwarded to the
/// holder, whose kernel runs the task; the stream comes back whole through the relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_asked_at_another_instance_is_served_by_the_holder() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        a,
        b,
    } = pair("observefwd", &[]).await;
    turn(&ka, "t1", "task-1", "working", vec![Item::Stall]);
    let run = spawn_post(&a.url(), body("t1", "r1", "go", &ws.cwd("t1"), json!({})));
    let start = Instant::now();
    let exec = loop {
        let doc = row(&pg, "observefwd", "t1").2;
        if doc["execution"]["taskId"] == "task-1" {
            break doc["execution"]["executionId"].as_str().unwrap().to_owned();
        }
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let c = ctx("t1");
    ka.task_is_working("task-1", &c, json!({}));
    ka.on(
        "SubscribeToTask",
        Stream::of("task-1", &c).text("observed", "m-1").completed(),
    );
    let seen = post(
        &format!(
            "{}extensions/iac-code/v1/executions/{exec}/subscribe",
            b.url()
        ),
        &json!({"threadId": "t1", "runId": "r1", "rosInvocationId": "inv-1"}),
        &[],
    )
    .await;
    assert_valid_run(&seen, "t1", "r1");
    assert_eq!(seen.last()["outcome"]["type"], "success", "{}", seen.raw);
    assert!(seen.raw.contains("observed"));
    assert_eq!(
        ka.calls("SubscribeToTask").len(),
        1,
        "A's kernel followed it"
    );
    assert!(kb.calls("GetTask").is_empty() && kb.calls("SubscribeToTask").is_empty());
    assert!(ka.calls("CancelTask").is_empty());
    run.abort();
}

/// The database goes away for longer than the lease: the holder's lease lapses (noticed before
/// another instance could take over), its run in flight ends with RUN_ERROR and its kernel task
/// is cancelled; once the database is back the instance serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lapsed_with_the_database_down_ends_the_runs_in_flight() {
    let pg = Cluster::start();
    let db = pg.create_db("lapse");
    let ws = Workspace::new();
    let k = FakeKernel::start().await;
    let a = Instance::start(&db, &["--a2a-url", &k.url(), "--lease-ttl", "2"], &ws.env());
    turn(&k, "t1", "task-1", "working", vec![Item::Stall]);
    let run = spawn_post(&a.url(), body("t1", "r1", "go", &ws.cwd("t1"), json!({})));
    let start = Instant::now();
    while row(&pg, "lapse", "t1").2["execution"]["taskId"] != "task-1" {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let down = Instant::now();
    pg.stop(Stop::Fast);
    let r = run.await.unwrap();
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(r.last()["code"], "STATE_PERSISTENCE_FAILED", "{}", r.raw);
    assert_eq!(
        r.last()["message"],
        "This gateway instance lost its lease on the shared state."
    );
    assert!(
        down.elapsed() < Duration::from_secs(4),
        "ended within the TTL: {:?}",
        down.elapsed()
    );
    assert_cancelled_once(&k).await;
    pg.start_again();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        turn(&k, "t2", "task-2", "again", vec![]);
        let r = post_turn(
            &a.url(),
            "t2",
            &format!("r{}", deadline.elapsed().as_millis()),
            "go",
            &ws.cwd("t2"),
        )
        .await;
        if r.status == 200 {
            assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
            break;
        }
        assert!(Instant::now() < deadline, "never served again: {}", r.raw);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A clean stop (SIGTERM) gives the instance's threads up at once: another instance resumes one
/// right away, without waiting for the lease (15 s here) to run out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_hands_the_threads_over_at_once() {
    let Pair {
        pg,
        ws,
        ka,
        kb,
        mut a,
        b,
    } = pair("handover", &[]).await;
    interrupting_turn(&ka, "t1", "task-1", "perm-1");
    let r = post_turn(&a.url(), "t1", "r1", "go", &ws.cwd("t1")).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt", "{}", r.raw);
    a.signal(libc::SIGTERM);
    let status = a.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let stopped = Instant::now();
    accepting_resume(&kb, "t1", "task-1", "perm-1");
    let r2 = post_resume(
        &b.url(),
        "t1",
        "r2",
        &ws.cwd("t1"),
        "inv-1",
        allow("perm-1"),
    )
    .await;
    assert_valid_run(&r2, "t1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
    assert_eq!(row(&pg, "handover", "t1").0, id_of(&pg, "handover", &b));
}

/// With a bearer token on the instances, the instance the client asked checks it first (a
/// request without it never leaves), and the holder accepts the forward, which carries the
/// caller that instance authenticated (not the token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_requests_carry_the_clients_token() {
    let pg = Cluster::start();
    let db = pg.create_db("token");
    let ws = Workspace::new();
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let mut env = ws.env();
    env.push(("IAC_CODE_AGUI_AUTH_TOKEN".into(), "s3cret".into()));
    let a = Instance::start(&db, &["--a2a-url", &ka.url()], &env);
    let b = Instance::start(&db, &["--a2a-url", &kb.url()], &env);
    let auth = [("authorization", "Bearer s3cret")];
    turn(&ka, "t1", "task-1", "from A", vec![]);
    let r = post_turn_as(&a.url(), "t1", "r1", "hi", &ws.cwd("t1"), &auth).await;
    assert_valid_run(&r, "t1", "r1");
    let refused = post_turn(&b.url(), "t1", "r2", "hi", &ws.cwd("t1")).await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        ka.calls("SendStreamingMessage").len(),
        1,
        "nothing was forwarded"
    );
    turn(&ka, "t1", "task-1", "again from A", vec![]);
    let r2 = post_turn_as(&b.url(), "t1", "r2", "hi", &ws.cwd("t1"), &auth).await;
    assert_valid_run(&r2, "t1", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    assert_eq!(ka.calls("SendStreamingMessage").len(), 2);
}
