// The operations strip and a thread's header (state and session lines), from the gateway's answers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { healthLine, holderText, sessionLine, threadLine } from "../src/strip.js";

const health = {
  serverVersion: "0.3.0",
  protocolVersions: ["0.1.20", "1.0.0"],
  kernel: { state: "ready", size: 2 },
};

test("the strip names the instance only when /health does", () => {
  assert.equal(healthLine(health), "server 0.3.0 · AG-UI 0.1.20, 1.0.0 · kernel ready (2)");
  assert.equal(
    healthLine({ ...health, instance: "i-a" }),
    "server 0.3.0 · AG-UI 0.1.20, 1.0.0 · kernel ready (2) · instance i-a",
  );
  assert.equal(healthLine({}), "server ? · AG-UI  · kernel ?");
});

test("a thread's holder: nothing on one instance, this one, another or none", () => {
  const t = { threadId: "t1", activeRun: null, pendingInterrupts: [], lastRun: null };
  assert.equal(holderText(t, "i-a"), "");
  assert.equal(holderText({ ...t, heldBy: "i-a" }, "i-a"), "held by this instance (i-a)");
  assert.equal(holderText({ ...t, heldBy: "i-b" }, "i-a"), "held by instance i-b");
  assert.equal(holderText({ ...t, heldBy: "i-b" }, undefined), "held by instance i-b");
  assert.equal(holderText({ ...t, heldBy: null }, "i-a"), "held by no instance (the next request takes it)");
});

test("the state line puts the holder last", () => {
  const t = {
    activeRun: { runId: "r2", state: "detached" },
    pendingInterrupts: [{ id: "i1" }],
    lastRun: { outcome: "error", code: "A2A_UNAVAILABLE" },
    binding: { cwd: "/w/t1" },
    heldBy: "i-b",
  };
  assert.equal(
    threadLine(t, "i-a"),
    "run r2 detached · 1 open interrupt(s) · last run error A2A_UNAVAILABLE · workspace /w/t1 · held by instance i-b",
  );
  assert.equal(threadLine({}, "i-a"), "");
});

test("the session line names the ids known so far, growing as later events add them", () => {
  const first = {
    schemaVersion: 1, threadId: "t1", aguiRunId: "r1", executionId: "e1", contextId: "c1",
    taskId: null, rosInvocationId: "ros-1", sessionId: null,
  };
  assert.equal(sessionLine(first), "execution e1");
  assert.equal(sessionLine({ ...first, taskId: "k1" }), "execution e1 · task k1");
  assert.equal(sessionLine({ ...first, taskId: "k1", sessionId: "s1" }), "execution e1 · task k1 · session s1");
  assert.equal(sessionLine(null), "");
});
