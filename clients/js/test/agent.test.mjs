// IacCodeAgent against a scripted gateway on 127.0.0.1, with @ag-ui/client 1.0.0 and 0.0.59:
// forwardedProps.iacCode from options, no client tools sent, a broken stream re-attached with
// Last-Event-ID, connect() applied (and applied again on a thread that waits for an answer),
// getCapabilities(). (The gateway itself, with the real kernel, is driven by the gateway's own
// test suite: crates/gateway/tests/it/js_client.rs.)

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";

import * as v1 from "@ag-ui/client";
import * as v0059 from "agui-client-0059";
import { makeIacCodeAgent, sseEvents } from "../src/agent.js";

const CLIENTS = [
  ["1.0.0", v1, "1.0"],
  ["0.0.59", v0059, undefined],
];

/** A gateway whose routes are `handlers[path]` (path without the query; `*` any other, added
 * while it runs through `gw.handlers`); records requests. */
async function gateway(handlers) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    let body = "";
    for await (const c of req) body += c;
    const path = req.url.split("?")[0];
    requests.push({ method: req.method, url: req.url, path, headers: req.headers, body });
    const h = handlers[path] ?? handlers["*"];
    if (!h) {
      res.writeHead(404).end();
      return;
    }
    await h(req, res, body ? JSON.parse(body) : null);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}/`;
  return { url, requests, handlers, close: () => new Promise((r) => server.close(r)) };
}

function sse(res) {
  res.writeHead(200, { "content-type": "text/event-stream" });
  return (id, event) => res.write(`${id === null ? "" : `id: ${id}\n`}data: ${JSON.stringify({ timestamp: 1, ...event })}\n\n`);
}

const started = (version, threadId, runId) => ({
  type: "RUN_STARTED", threadId, runId, ...(version ? { protocolVersion: version } : {}),
});

for (const [name, agui, version] of CLIENTS) {
  const IacCodeAgent = makeIacCodeAgent(agui);

  test(`${name}: a run carries iacCode from the options and no client tools`, async () => {
    const gw = await gateway({
      "/": (req, res, body) => {
        const send = sse(res);
        send(1, started(version, body.threadId, body.runId));
        send(2, { type: "TEXT_MESSAGE_START", messageId: "m1", role: "assistant" });
        send(3, { type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: "Done." });
        send(4, { type: "TEXT_MESSAGE_END", messageId: "m1" });
        send(5, { type: "RUN_FINISHED", threadId: body.threadId, runId: body.runId });
        res.end();
      },
    });
    try {
      const agent = new IacCodeAgent({
        url: gw.url,
        threadId: "t1",
        headers: { authorization: "Bearer tok" },
        iacCode: { cwd: "/w/t1", rosInvocationId: "inv-1", model: "m-default" },
      });
      agent.addMessage({ id: "u1", role: "user", content: "Hi" });
      await agent.runAgent({
        forwardedProps: { iacCode: { model: "m-run" }, other: 1 },
        tools: [{ name: "frontendAction", description: "d", parameters: { type: "object" } }],
      });
      const sent = JSON.parse(gw.requests[0].body);
      assert.deepEqual(sent.forwardedProps, {
        other: 1,
        iacCode: { schemaVersion: 1, cwd: "/w/t1", rosInvocationId: "inv-1", model: "m-run" },
      });
      assert.deepEqual(sent.tools, []);
      assert.equal(gw.requests[0].headers.authorization, "Bearer tok");
      if (version) assert.equal(sent.protocolVersion, "1.0");
      assert.equal(agent.messages.at(-1).content, "Done.");
    } finally {
      await gw.close();
    }
  });

  test(`${name}: a stream that breaks mid-run is re-attached after its last event id`, async () => {
    let runId;
    const gw = await gateway({
      "/": (req, res, body) => {
        runId = body.runId;
        const send = sse(res);
        send(1, started(version, body.threadId, body.runId));
        send(2, { type: "TEXT_MESSAGE_START", messageId: "m1", role: "assistant" });
        send(3, { type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: "Hel" });
        // The connection drops.
        setTimeout(() => res.socket.destroy(), 50);
      },
    });
    const reattach = (req, res) => {
      const send = sse(res);
      send(4, { type: "TEXT_MESSAGE_CONTENT", messageId: "m1", delta: "lo" });
      send(5, { type: "TEXT_MESSAGE_END", messageId: "m1" });
      send(6, { type: "RUN_FINISHED", threadId: "t2", runId });
      res.end();
    };
    try {
      const agent = new IacCodeAgent({
        url: gw.url, threadId: "t2", headers: { authorization: "Bearer tok" }, reattachDelayMs: 10,
      });
      agent.addMessage({ id: "u1", role: "user", content: "Hi" });
      const running = agent.runAgent({});
      // The events route of the run, known once the run started.
      while (!runId) await new Promise((r) => setTimeout(r, 5));
      const path = `/threads/t2/runs/${runId}/events`;
      gw.handlers[path] = reattach;
      await running;
      assert.equal(agent.messages.at(-1).content, "Hello");
      const again = gw.requests.find((r) => r.path === path);
      assert.ok(again, "re-attached");
      assert.equal(again.method, "GET");
      assert.equal(again.headers["last-event-id"], "3");
      assert.equal(again.headers.authorization, "Bearer tok");
    } finally {
      await gw.close();
    }
  });

  test(`${name}: a run whose events are gone fails with the gateway's code`, async () => {
    const gw = await gateway({
      "/": (req, res, body) => {
        const send = sse(res);
        send(1, started(version, body.threadId, body.runId));
        setTimeout(() => res.socket.destroy(), 20);
      },
    });
    gw.handlers["*"] = (req, res) => {
      res.writeHead(410, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "RUN_EVENTS_GONE", message: "gone" } }));
    };
    try {
      const agent = new IacCodeAgent({ url: gw.url, threadId: "t3", reattachDelayMs: 5 });
      agent.addMessage({ id: "u1", role: "user", content: "Hi" });
      await assert.rejects(agent.runAgent({}), (e) => /RUN_EVENTS_GONE/.test(String(e?.message ?? e)));
    } finally {
      await gw.close();
    }
  });

  test(`${name}: connect() restores the thread from the gateway`, async () => {
    const messages = [
      { id: "u1", role: "user", content: "Create a VPC" },
      { id: "m1", role: "assistant", content: "Created." },
    ];
    const gw = await gateway({
      "/threads/t4/connect": (req, res) => {
        const send = sse(res);
        send(null, started(version, "t4", "connect-1"));
        send(null, { type: "MESSAGES_SNAPSHOT", messages });
        send(null, { type: "RUN_FINISHED", threadId: "t4", runId: "connect-1" });
        res.end();
      },
    });
    try {
      const agent = new IacCodeAgent({ url: gw.url, threadId: "t4", follow: true });
      await agent.connectAgent({});
      assert.deepEqual(agent.messages.map((m) => [m.id, m.content]), messages.map((m) => [m.id, m.content]));
      const q = new URL(gw.requests[0].url, gw.url).searchParams;
      assert.equal(q.get("protocolVersion"), version ?? null);
      assert.equal(q.get("follow"), "true");
    } finally {
      await gw.close();
    }
  });

  test(`${name}: connect() again on a thread that waits for an answer`, async () => {
    // A reloaded page connects, and connects again (a second tab, a reconnect after sleep) while
    // the thread still waits for the answer to a permission; then the answer is given elsewhere.
    const interrupt = { id: "perm-1", reason: "tool_call", message: "Allow bash?" };
    let answered = false;
    let connects = 0;
    const gw = await gateway({
      "/": (req, res, body) => {
        const send = sse(res);
        send(1, started(version, body.threadId, body.runId));
        send(2, { type: "RUN_FINISHED", threadId: body.threadId, runId: body.runId,
          outcome: { type: "interrupt", interrupts: [interrupt] } });
        res.end();
      },
      "/threads/t5/connect": (req, res) => {
        connects += 1;
        const send = sse(res);
        send(null, started(version, "t5", `connect-${connects}`));
        send(null, { type: "MESSAGES_SNAPSHOT", messages: [{ id: "u1", role: "user", content: "Run." }] });
        send(null, { type: "RUN_FINISHED", threadId: "t5", runId: `connect-${connects}`,
          outcome: answered ? { type: "success" } : { type: "interrupt", interrupts: [interrupt] } });
        res.end();
      },
    });
    try {
      const agent = new IacCodeAgent({ url: gw.url, threadId: "t5" });
      const pending = () => (agent.pendingInterrupts ?? []).map((i) => i.id);
      // The agent's own run stopped at the interrupt: connecting does not need to answer it.
      agent.addMessage({ id: "u1", role: "user", content: "Run." });
      await agent.runAgent({});
      assert.deepEqual(pending(), ["perm-1"]);
      await agent.connectAgent({});
      assert.deepEqual(pending(), ["perm-1"]);
      await agent.connectAgent({});
      assert.deepEqual(pending(), ["perm-1"]);
      // Answered from another page: the next connect says the thread waits for nothing.
      answered = true;
      await agent.connectAgent({});
      assert.deepEqual(pending(), []);
      assert.equal(connects, 3);
      assert.deepEqual(agent.messages.map((m) => m.id), ["u1"]);
    } finally {
      await gw.close();
    }
  });

  test(`${name}: a connect that fails keeps the interrupts the agent knew`, async () => {
    const interrupt = { id: "perm-2", reason: "tool_call", message: "Allow bash?" };
    let up = true;
    const gw = await gateway({
      "/threads/t6/connect": (req, res) => {
        if (!up) {
          res.writeHead(503, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: { code: "UNAVAILABLE", message: "down" } }));
          return;
        }
        const send = sse(res);
        send(null, started(version, "t6", "connect-1"));
        send(null, { type: "MESSAGES_SNAPSHOT", messages: [] });
        send(null, { type: "RUN_FINISHED", threadId: "t6", runId: "connect-1",
          outcome: { type: "interrupt", interrupts: [interrupt] } });
        res.end();
      },
    });
    try {
      const agent = new IacCodeAgent({ url: gw.url, threadId: "t6" });
      await agent.connectAgent({});
      assert.deepEqual(agent.pendingInterrupts.map((i) => i.id), ["perm-2"]);
      up = false;
      await assert.rejects(agent.connectAgent({}), /UNAVAILABLE/);
      assert.deepEqual(agent.pendingInterrupts.map((i) => i.id), ["perm-2"]);
    } finally {
      await gw.close();
    }
  });

  test(`${name}: getCapabilities() reads the gateway's`, async () => {
    const caps = { identity: { name: "iac-code" }, tools: { clientProvided: false } };
    const gw = await gateway({
      "/capabilities": (req, res) => {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify(caps));
      },
    });
    try {
      const agent = new IacCodeAgent({ url: gw.url, headers: { authorization: "Bearer tok" } });
      assert.deepEqual(await agent.getCapabilities(), caps);
      assert.equal(gw.requests[0].headers.authorization, "Bearer tok");
    } finally {
      await gw.close();
    }
  });
}

test("SSE events are split with their ids, whatever the chunks", async () => {
  const text = "id: 1\ndata: {\"a\":1}\n\n: heartbeat\n\nid: r:2\r\ndata: x\r\ndata: y\r\n\r\n";
  const bytes = new TextEncoder().encode(text);
  const body = new ReadableStream({
    start(c) {
      for (let i = 0; i < bytes.length; i += 3) c.enqueue(bytes.slice(i, i + 3));
      c.close();
    },
  });
  const got = [];
  for await (const e of sseEvents(body)) got.push(e);
  assert.deepEqual(got, [{ id: "1", data: "{\"a\":1}" }, { id: "r:2", data: "x\ny" }]);
});
