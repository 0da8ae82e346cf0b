// CopilotKit's runtime 1.75.0, served in process (createCopilotRuntimeHandler, fetch requests),
// with IacCodeAgent and IacCodeAgentRunner in front of the gateway and the real kernel: /info,
// a run, a permission interrupt and its resume, a stop mid-run (the gateway cancels), and a new
// runtime instance after a "restart" that connects to the thread and gets its whole history from
// the gateway (nothing of it was in the new runtime).
// (The run requests are posted as RunAgentInput, as the runtime's own clients send them.)
//
// Usage: GATEWAY_URL=… THREAD=… CWD=… [AUTH="Bearer …"] node run.mjs
// Prints a JSON report on stdout; exit status 0 only when every check passed.

process.env.COPILOTKIT_TELEMETRY_DISABLED = "true";
process.env.DO_NOT_TRACK = "1";

import { randomUUID } from "node:crypto";
import * as agui from "@ag-ui/client";
import { CopilotRuntime, createCopilotRuntimeHandler } from "@copilotkit/runtime/v2";
import { makeIacCodeAgent } from "../../src/agent.js";
import { IacCodeAgentRunner } from "../../src/runner.js";

const problems = [];
const check = (ok, what) => { if (!ok) problems.push(what); };
const gateway = process.env.GATEWAY_URL;
const threadId = process.env.THREAD;
const headers = process.env.AUTH ? { authorization: process.env.AUTH } : {};
const IacCodeAgent = makeIacCodeAgent(agui);
const report = { steps: [] };

/** A runtime instance, as a process would make it: nothing of any thread in it. */
function runtime() {
  const rt = new CopilotRuntime({
    agents: {
      iac: new IacCodeAgent({
        url: gateway,
        headers,
        iacCode: { cwd: process.env.CWD, rosInvocationId: "inv-1" },
      }),
    },
    runner: new IacCodeAgentRunner({ url: gateway, headers }),
  });
  return createCopilotRuntimeHandler({ runtime: rt, basePath: "/api/copilotkit" });
}

async function sse(res) {
  const text = await res.text();
  return text
    .split("\n\n")
    .map((b) => b.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n"))
    .filter((d) => d)
    .map((d) => JSON.parse(d));
}

const messages = [];
async function post(handler, path, body) {
  return handler(new Request(`http://runtime.local/api/copilotkit${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
  }));
}

function input(extra = {}) {
  return { threadId, runId: randomUUID(), state: {}, messages, tools: [], context: [], forwardedProps: {}, ...extra };
}

const outcome = (ev) => {
  const last = ev.at(-1);
  return last?.type === "RUN_ERROR" ? `error ${last.code}` : last?.outcome?.type ?? (last?.type === "RUN_FINISHED" ? "success" : `none (${last?.type})`);
};

try {
  let handler = runtime();
  // /info: the agent is there.
  const info = await (await handler(new Request("http://runtime.local/api/copilotkit/info", { headers }))).json();
  check(info?.agents?.iac !== undefined, `info: ${JSON.stringify(info).slice(0, 300)}`);
  // The gateway's capabilities, read through the agent's getCapabilities().
  const caps = info?.agents?.iac?.capabilities;
  check(typeof caps?.identity?.name === "string" && caps?.tools?.clientProvided === false,
    `info capabilities: ${JSON.stringify(caps)}`);
  report.steps.push({ name: "info", agents: Object.keys(info?.agents ?? {}) });

  // A run.
  messages.push({ id: randomUUID(), role: "user", content: "Hello. scenario:text" });
  let ev = await sse(await post(handler, "/agent/iac/run", input()));
  check(outcome(ev) === "success", `run: ${outcome(ev)}`);
  const text = ev.filter((e) => e.type === "TEXT_MESSAGE_CONTENT").map((e) => e.delta).join("");
  check(text === "Hello from the fake LLM.", `run text: ${text}`);
  report.steps.push({ name: "run", outcome: outcome(ev) });

  // A permission interrupt and its resume.
  messages.push({ id: randomUUID(), role: "user", content: "Run. scenario:bash" });
  ev = await sse(await post(handler, "/agent/iac/run", input()));
  check(outcome(ev) === "interrupt", `interrupt: ${outcome(ev)}`);
  const interrupts = ev.at(-1)?.outcome?.interrupts ?? [];
  const resume = interrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: { decision: "allow_once" } }));
  ev = await sse(await post(handler, "/agent/iac/run", input({ resume })));
  check(outcome(ev) === "success", `resume: ${outcome(ev)}`);
  report.steps.push({ name: "interrupt and resume", interrupts: interrupts.length, outcome: outcome(ev) });

  // Stop mid-run: the runtime's stop route, the runner's stop, the gateway's cancellation.
  messages.push({ id: randomUUID(), role: "user", content: "Slow. scenario:slow" });
  const running = post(handler, "/agent/iac/run", input()).then(sse);
  let stopped = null;
  for (let i = 0; i < 100 && !stopped; i++) {
    await new Promise((r) => setTimeout(r, 200));
    const thread = await (await fetch(new URL(`threads/${threadId}`, gateway), { headers })).json();
    if (thread.activeRun) {
      await new Promise((r) => setTimeout(r, 1000));
      stopped = await post(handler, `/agent/iac/stop/${encodeURIComponent(threadId)}`, {});
    }
  }
  check(stopped?.ok, `stop answered ${stopped?.status}`);
  ev = await running;
  check(/cancelled|error CANCELLED/.test(outcome(ev)), `stopped run: ${outcome(ev)}`);
  report.steps.push({ name: "stop", status: stopped?.status, outcome: outcome(ev) });

  // A "restart": a new runtime instance, nothing of the thread in it, connects.
  handler = runtime();
  ev = await sse(await post(handler, "/agent/iac/connect", input({ messages: [] })));
  const snapshot = ev.find((e) => e.type === "MESSAGES_SNAPSHOT");
  const users = (snapshot?.messages ?? []).filter((m) => m.role === "user").map((m) => m.content);
  check(
    JSON.stringify(users) === JSON.stringify(messages.map((m) => m.content)),
    `connect after restart: users ${JSON.stringify(users)}`,
  );
  const texts = (snapshot?.messages ?? []).filter((m) => m.role === "assistant" && m.content).map((m) => m.content);
  check(texts.includes("Hello from the fake LLM."), `connect after restart: texts ${JSON.stringify(texts)}`);
  report.steps.push({ name: "connect after restart", messages: snapshot?.messages?.length ?? 0, types: ev.map((e) => e.type) });
} catch (e) {
  problems.push(`failed: ${e?.stack ?? e}`);
}

report.ok = problems.length === 0;
report.problems = problems;
process.stdout.write(JSON.stringify(report) + "\n");
process.exit(report.ok ? 0 : 1);
