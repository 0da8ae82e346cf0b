// IacCodeAgentRunner against a scripted gateway: connect streams the gateway's thread with the
// browser's token, isRunning asks the gateway, stop cancels the execution of the run it started.

import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { firstValueFrom, toArray } from "rxjs";

import * as agui from "@ag-ui/client";
import { makeIacCodeAgent } from "../src/agent.js";
import { IacCodeAgentRunner } from "../src/runner.js";

async function gateway(handlers) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    let body = "";
    for await (const c of req) body += c;
    const path = req.url.split("?")[0];
    requests.push({ method: req.method, url: req.url, path, headers: req.headers, body });
    const h = handlers[`${req.method} ${path}`];
    if (!h) return res.writeHead(404, { "content-type": "application/json" }).end("{}");
    await h(req, res, body ? JSON.parse(body) : null);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${server.address().port}/`, requests, close: () => new Promise((r) => server.close(r)) };
}

const json = (res, v) => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(v));

test("connect, isRunning and stop ask the gateway; run passes the agent's events on", async () => {
  const gw = await gateway({
    "GET /threads/t1/connect": (req, res) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (const e of [
        { type: "RUN_STARTED", threadId: "t1", runId: "connect-1", protocolVersion: "1.0" },
        { type: "MESSAGES_SNAPSHOT", messages: [{ id: "u1", role: "user", content: "hi" }] },
        { type: "RUN_FINISHED", threadId: "t1", runId: "connect-1" },
      ]) res.write(`data: ${JSON.stringify(e)}\n\n`);
      res.end();
    },
    "GET /threads/t1": (req, res) => json(res, { threadId: "t1", activeRun: { runId: "r1" } }),
    "GET /threads/t2": (req, res) => json(res, { threadId: "t2", activeRun: null }),
    "POST /": (req, res, body) => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const send = (id, e) => res.write(`id: ${id}\ndata: ${JSON.stringify({ timestamp: 1, ...e })}\n\n`);
      send(1, { type: "RUN_STARTED", threadId: body.threadId, runId: body.runId, protocolVersion: "1.0" });
      send(2, { type: "CUSTOM", name: "iac-code.session.v1", value: { executionId: "e-1", rosInvocationId: "inv-1" } });
      send(3, { type: "RUN_FINISHED", threadId: body.threadId, runId: body.runId });
      res.end();
    },
    "POST /extensions/iac-code/v1/executions/e-1/cancel": (req, res, body) =>
      json(res, { executionId: "e-1", status: body.rosInvocationId === "inv-1" ? "cancelled" : "bad" }),
  });
  try {
    const runner = new IacCodeAgentRunner({ url: gw.url, headers: { "x-service": "s" }, protocolVersion: "1.0" });
    const events = await firstValueFrom(
      runner.connect({ threadId: "t1", headers: { authorization: "Bearer user", cookie: "no" } }).pipe(toArray()),
    );
    assert.deepEqual(events.map((e) => e.type), ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]);
    const asked = gw.requests[0];
    assert.equal(asked.url, "/threads/t1/connect?protocolVersion=1.0");
    assert.equal(asked.headers.authorization, "Bearer user");
    assert.equal(asked.headers.cookie, undefined, "only the named headers are passed on");
    assert.equal(asked.headers["x-service"], "s");
    // A thread the gateway does not know: nothing to replay.
    assert.deepEqual(await firstValueFrom(runner.connect({ threadId: "nope" }).pipe(toArray())), []);
    assert.equal(await runner.isRunning({ threadId: "t1" }), true);
    assert.equal(await runner.isRunning({ threadId: "t2" }), false);
    assert.equal(await runner.isRunning({ threadId: "nope" }), false);
    // Nothing of its own to stop yet.
    assert.equal(await runner.stop({ threadId: "t1" }), false);
    // A run it passes on: the session event names the execution stop cancels (while it runs).
    const Agent = makeIacCodeAgent(agui);
    const agent = new Agent({ url: gw.url, threadId: "t1" });
    const input = { threadId: "t1", runId: "r9", messages: [{ id: "u2", role: "user", content: "go" }], tools: [], context: [], state: {}, forwardedProps: {} };
    let stopped;
    const seen = await firstValueFrom(
      new (await import("rxjs")).Observable((s) => {
        const sub = runner.run({ threadId: "t1", agent, input }).subscribe({
          next: async (e) => {
            s.next(e);
            if (e.type === "CUSTOM") stopped = runner.stop({ threadId: "t1" });
          },
          error: (e) => s.error(e),
          complete: () => s.complete(),
        });
        return () => sub.unsubscribe();
      }).pipe(toArray()),
    );
    assert.deepEqual(seen.map((e) => e.type), ["RUN_STARTED", "CUSTOM", "RUN_FINISHED"]);
    assert.equal(await stopped, true);
    const cancel = gw.requests.find((r) => r.path.endsWith("/cancel"));
    assert.deepEqual(JSON.parse(cancel.body), { threadId: "t1", rosInvocationId: "inv-1" });
    // The run ended: nothing left to stop.
    assert.equal(await runner.stop({ threadId: "t1" }), false);
  } finally {
    await gw.close();
  }
});
