//! Runs against the scriptable fake kernel, by run mode: new turns, resumes, guidance, pipelines.
//! Each stream must be valid (one terminal event, balanced spans).

mod guidance;
mod pipeline;
mod resume;
mod turn;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clock::OffsetClock;
use store::FileStore;

use crate::support::FaultyStore;
use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Reply, Stream};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{
    assert_cancelled_once, body, client, ctx, fake_gateway, flood, guidance_body, post_resume,
    post_turn, post_turn_as, resume_body, spawn_post, Builder, TestServer,
};

fn r(v: Value) -> Item {
    Item::Result(v)
}

async fn run_with(items: Vec<Item>) -> (testkit::sse::RunResult, FakeKernel, TestServer) {
    let (s, k) = fake_gateway().await;
    k.on("SendStreamingMessage", Reply::Sse(items));
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    assert_valid_run(&res, "t1", "r1");
    (res, k, s)
}

fn perm(id: &str, tool: &str, thread: &str) -> Value {
    json!({"schemaVersion":1.0,"kind":"permission","requestTaskId":"task-1","contextId":ctx(thread),"inputId":id,"toolUseId":tool,
        "toolName":"bash","prompt":"Run bash Allow once?","title":"Run bash","options":[{"id":"allow_once","label":"Allow once"},{"id":"deny","label":"Deny"}],
        "language":"en","required":true,"secretThing":"zzz"})
}

async fn interrupted(s: &TestServer, k: &FakeKernel, input: Value) -> testkit::sse::RunResult {
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .text("Let me run", "m-a")
            .working(json!({"tool": {"status": "started", "toolUseId": "tu1", "name": "bash"}}))
            .input_required(json!({"input": input})),
    );
    let res = post_turn(&s.url, "t1", "r1", "x", &s.ws("w")).await;
    assert_valid_run(&res, "t1", "r1");
    res
}

fn perm_sb(id: &str) -> Value {
    json!({"schemaVersion":1,"kind":"permission","requestTaskId":"task-1","contextId":ctx("t1"),"inputId":id,"toolUseId":format!("tu-{id}"),
        "scope":"candidate","subPipelineId":"c1","required":true})
}

fn get_task(meta: Value) -> Reply {
    Reply::task("task-1", &ctx("t1"), "TASK_STATE_INPUT_REQUIRED", meta)
}
