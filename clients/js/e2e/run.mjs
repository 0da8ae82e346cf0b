// IacCodeAgent against a running gateway and the real kernel (driven by the gateway's test suite,
// crates/gateway/tests/it/js_client.rs, with its scripted fake LLM).
//
// Usage: CLIENT=1|0059 GATEWAY_URL=… THREAD=… CWD=… [AUTH="Bearer …"] node e2e/run.mjs
// Prints a JSON report on stdout; exit status 0 only when every check passed.

import { randomUUID } from "node:crypto";
import { makeIacCodeAgent } from "../src/agent.js";

const problems = [];
const check = (ok, what) => { if (!ok) problems.push(what); };
const agui = await import(process.env.CLIENT === "0059" ? "agui-client-0059" : "@ag-ui/client");
const IacCodeAgent = makeIacCodeAgent(agui);
const v1 = process.env.CLIENT !== "0059";
const url = process.env.GATEWAY_URL;
const threadId = process.env.THREAD;
const headers = process.env.AUTH ? { authorization: process.env.AUTH } : {};
const options = { url, threadId, headers, iacCode: { cwd: process.env.CWD, rosInvocationId: "inv-1" } };
const report = { client: process.env.CLIENT, steps: [] };

const say = (agent, text) => agent.addMessage({ id: randomUUID(), role: "user", content: text });
const texts = (agent) => agent.messages.filter((m) => m.role === "assistant" && m.content).map((m) => m.content);
const outcomeOf = (events) => {
  const last = events.at(-1);
  return last?.type === "RUN_ERROR" ? `error ${last.code}` : last?.outcome?.type ?? (last?.type === "RUN_FINISHED" ? "success" : "none");
};

async function run(agent, params, name, { cut } = {}) {
  const events = [];
  try {
    await agent.runAgent({ runId: randomUUID(), ...params }, { onEvent: ({ event }) => { events.push(event); } });
  } catch (e) {
    problems.push(`${name}: runAgent rejected: ${e?.message ?? e}`);
  }
  report.steps.push({ name, outcome: outcomeOf(events), types: events.map((e) => e.type) });
  return events;
}

try {
  // 1. A run: iacCode from the options; CopilotKit-style frontend tools stay in the browser.
  const agent = new IacCodeAgent(options);
  say(agent, "Hello. scenario:text");
  let ev = await run(agent, { tools: [{ name: "showToast", description: "a frontend action", parameters: { type: "object", properties: {} } }] }, "text");
  check(outcomeOf(ev) === "success", `text: ${outcomeOf(ev)}`);
  check(texts(agent).at(-1) === "Hello from the fake LLM.", `text: ${texts(agent)}`);

  // 2. A stream cut mid-run (the network drops it): re-attached, the text whole.
  let cuts = 0;
  const cutting = new IacCodeAgent({
    ...options,
    reattachDelayMs: 100,
    fetch: async (input, init) => {
      const res = await fetch(input, init);
      if (init?.method !== "POST" || cuts > 0) return res;
      cuts += 1;
      // Passes the body on until some text went by, then breaks it.
      const reader = res.body.getReader();
      let seen = "";
      const body = new ReadableStream({
        async pull(c) {
          const { value, done } = await reader.read();
          if (done) return c.close();
          seen += new TextDecoder().decode(value);
          c.enqueue(value);
          if ((seen.match(/TEXT_MESSAGE_CONTENT/g) ?? []).length >= 3) {
            reader.cancel().catch(() => {});
            c.error(new TypeError("network error"));
          }
        },
      });
      return new Response(body, { status: res.status, headers: res.headers });
    },
  });
  const earlier = agent.messages.map((m) => ({ ...m }));
  if (typeof cutting.setMessages === "function") cutting.setMessages(earlier);
  else cutting.messages = earlier;
  say(cutting, "Go steadily. scenario:steady");
  ev = await run(cutting, {}, "cut and re-attached");
  const steady = Array.from({ length: 24 }, (_, i) => `step${i} `).join("");
  check(cuts === 1, `the stream was not cut (${cuts})`);
  check(outcomeOf(ev) === "success", `re-attach: ${outcomeOf(ev)}`);
  check(texts(cutting).at(-1) === steady, `re-attach text: ${JSON.stringify(texts(cutting).at(-1))}`);

  // 3. A permission interrupt.
  say(cutting, "Run. scenario:bash");
  ev = await run(cutting, {}, "interrupt");
  check(outcomeOf(ev) === "interrupt", `interrupt: ${outcomeOf(ev)}`);
  const interrupts = ev.at(-1)?.outcome?.interrupts ?? [];

  // 4. A reloaded page: a new agent connects and has the thread, the interrupt pending.
  const reloaded = new IacCodeAgent(options);
  await reloaded.connectAgent({});
  const view = (a) => JSON.stringify({
    users: a.messages.filter((m) => m.role === "user").map((m) => [m.id, m.content]),
    texts: texts(a),
  });
  check(view(reloaded) === view(cutting), `connect: ${view(reloaded)} vs ${view(cutting)}`);
  const pendingIds = (a) => JSON.stringify((a.pendingInterrupts ?? []).map((i) => i.id));
  const waiting = JSON.stringify(interrupts.map((i) => i.id));
  if (v1) check(pendingIds(reloaded) === waiting, `pending after connect: ${pendingIds(reloaded)}`);
  report.steps.push({ name: "connect", messages: reloaded.messages.length });

  // 4b. It connects again (a reconnect, a second tab) while the thread still waits for the answer.
  try {
    await reloaded.connectAgent({});
    check(view(reloaded) === view(cutting), `connect again: ${view(reloaded)} vs ${view(cutting)}`);
    if (v1) check(pendingIds(reloaded) === waiting, `pending after connecting again: ${pendingIds(reloaded)}`);
    report.steps.push({ name: "connect again", pending: JSON.parse(pendingIds(reloaded)) });
  } catch (e) {
    problems.push(`connect again: ${e?.message ?? e}`);
  }

  // 5. The reloaded page answers it.
  const resume = interrupts.map((i) => ({ interruptId: i.id, status: "resolved", payload: { decision: "allow_once" } }));
  ev = await run(reloaded, { resume }, "resume after reload");
  check(outcomeOf(ev) === "success", `resume: ${outcomeOf(ev)}`);

  // 6. Capabilities.
  const caps = await reloaded.getCapabilities();
  check(typeof caps?.identity?.name === "string" && caps.identity.name.length > 0, `capabilities: ${JSON.stringify(caps)}`);
  check(caps?.tools?.clientProvided === false, "capabilities: tools.clientProvided");
} catch (e) {
  problems.push(`failed: ${e?.stack ?? e}`);
}

report.ok = problems.length === 0;
report.problems = problems;
process.stdout.write(JSON.stringify(report) + "\n");
process.exit(report.ok ? 0 : 1);
