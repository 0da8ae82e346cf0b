// AG-UI client conformance runner.
//
// Drives the gateway with the official TypeScript client (`HttpAgent`, real HTTP, real SSE parsing)
// and fails on anything the client rejects or silently repairs:
//   * a rejected runAgent() (AGUIError / ZodError / HTTP error),
//   * any console line starting with "[ag-ui]" ("[ag-ui][enforce]", "[ag-ui][compat]", …),
//   * a stream without exactly one terminal event as its last event,
//   * events whose threadId/runId differ from the request,
//   * RUN_ERROR where success was expected (and the wrong outcome in general),
//   * messages of the agent that share an id or have none, and a list of messages not the one a
//     step names (see "messages" below),
//   * a RUN_STARTED that declares a protocol version to a 0.0.x client, or none to a 1.0 client
//     (the 1.0 client sends "protocolVersion": "1.0"; the gateway answers in its dialect).
//
// Usage: node run.mjs < plan.json
//   {"client": "1" | "0059" | "0058", "url": "http://127.0.0.1:8000/", "threadId": "t1", "headers": {},
//    "forwardedProps": {...}, "steps": [
//      {"message": "text", "expect": "success"},
//      {"message": "run a tool", "expect": "interrupt"},
//      {"resume": "allow_once" | "deny" | "cancelled" | {payload object}, "expect": "success"},
//      {"message": "slow", "cancel": true, "expect": "error", "code": "CANCELLED"},
//      {"message": "slow", "cancel": true, "expect": "cancelled"},
//      {"connect": true, "expect": "success" | "interrupt"}]}
// A connect step is a reloaded page: a new agent reads GET /threads/{id}/connect through the
// client's own pipeline (verifier, MESSAGES_SNAPSHOT applied) and must end with the messages and
// pending interrupts the live agent has.
// After every step the agent's messages (the live agent's, or the connected one's for a connect
// step) must each have an id of their own, none empty. A step may also name the conversation's
// messages, in order: "messages": ["user: Run.*", "assistant+tools: I will run a command.", "tool",
// "assistant: Done.*"] — each entry a role ("assistant+tools" for an assistant message with tool
// calls, "assistant" for one without), optionally followed by ": " and its text (exact, or a
// prefix when it ends with "*"). Activity messages (the gateway's records of interrupts, answers,
// errors and pipeline snapshots, which a reloaded page has and a live agent may not) are not part
// of that list. The report lists each step's messages in that notation (an activity as
// "activity: <activityType>").
// Prints a JSON report on stdout; exit status 0 only when every check passed.

import { randomUUID } from "node:crypto";

const problems = [];
const captured = [];
for (const level of ["log", "info", "warn", "error", "debug"]) {
  const original = console[level].bind(console);
  console[level] = (...args) => {
    const line = args.map((a) => (typeof a === "string" ? a : String(a?.message ?? a))).join(" ");
    captured.push(line);
    if (line.startsWith("[ag-ui]")) {
      problems.push(`client warning: ${line}`);
    }
    original(...args);
  };
}

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return JSON.parse(Buffer.concat(chunks).toString("utf8"));
}

const plan = await readStdin();
const packages = { "1": "agui-client-1", "0059": "agui-client-0059", "0058": "agui-client-0058" };
if (!packages[plan.client]) throw new Error(`unknown client ${plan.client}`);
const mod = await import(packages[plan.client]);
const { HttpAgent } = mod;

const agent = new HttpAgent({ url: plan.url, threadId: plan.threadId, headers: plan.headers ?? {} });
const report = { client: plan.client, threadId: plan.threadId, steps: [] };

function addUserMessage(text) {
  const msg = { id: randomUUID(), role: "user", content: text };
  if (typeof agent.addMessage === "function") agent.addMessage(msg);
  else agent.messages.push(msg);
}

function checkStream(step, events, runId) {
  const where = `step ${step.index}`;
  if (events.length === 0) {
    problems.push(`${where}: no events`);
    return null;
  }
  if (events[0].type !== "RUN_STARTED") problems.push(`${where}: first event is ${events[0].type}`);
  const declared = events[0].protocolVersion;
  const wanted = plan.client === "1" ? "1.0" : undefined;
  if (events[0].type === "RUN_STARTED" && declared !== wanted) {
    problems.push(`${where}: RUN_STARTED declares protocolVersion ${declared}, expected ${wanted}`);
  }
  const terminals = events
    .map((e, i) => [e.type, i])
    .filter(([t]) => t === "RUN_FINISHED" || t === "RUN_ERROR");
  if (terminals.length !== 1 || terminals[0][1] !== events.length - 1) {
    problems.push(`${where}: expected exactly one terminal event as the last event, got ${JSON.stringify(terminals)}`);
  }
  for (const e of events) {
    const carriesIds = e.type === "RUN_STARTED" || e.type === "RUN_FINISHED" ||
      (e.type === "RUN_ERROR" && (e.threadId !== undefined || e.runId !== undefined));
    if (carriesIds && (e.threadId !== plan.threadId || e.runId !== runId)) {
      problems.push(`${where}: ${e.type} carries threadId=${e.threadId} runId=${e.runId}, expected ${plan.threadId}/${runId}`);
    }
    if (!Number.isInteger(e.timestamp)) problems.push(`${where}: ${e.type} without an integer timestamp`);
  }
  return events[events.length - 1];
}

async function cancelWhenStreaming(events, done) {
  // Waits for the session event and some content, then calls the cancellation extension.
  for (let i = 0; i < 600 && !done.value; i++) {
    const session = [...events].reverse().find((e) => e.type === "CUSTOM" && e.name === "iac-code.session.v1" && e.value?.taskId);
    const content = events.some((e) => e.type === "TEXT_MESSAGE_CONTENT");
    if (session && content) {
      const url = new URL(`extensions/iac-code/v1/executions/${session.value.executionId}/cancel`, plan.url);
      const r = await fetch(url, {
        method: "POST",
        headers: { "content-type": "application/json", ...(plan.headers ?? {}) },
        body: JSON.stringify({ threadId: plan.threadId, rosInvocationId: session.value.rosInvocationId }),
      });
      return await r.json();
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  problems.push("cancel: no session event with a task id and content arrived");
  return null;
}

/// A reloaded page: a new agent of the same client reads the thread's connect stream.
class Connecting extends HttpAgent {
  requestInit() {
    return {
      method: "GET",
      headers: { ...this.headers, Accept: "text/event-stream" },
      signal: this.abortController?.signal,
    };
  }
}

/// A message's role in the notation of a step's "messages", and its text.
const roleOf = (m) => (m.role === "assistant" && (m.toolCalls ?? []).length > 0 ? "assistant+tools" : m.role);
const textOf = (m) => (typeof m.content === "string" ? m.content : m.content === undefined ? "" : JSON.stringify(m.content));

/// A message in that notation ("role: text", "role" when it has no text).
function describe(m) {
  if (m.role === "activity") return `activity: ${m.activityType}`;
  return textOf(m) ? `${roleOf(m)}: ${textOf(m)}` : roleOf(m);
}

/// Every message has an id of its own; and the conversation is the step's "messages" when it
/// names one.
function checkMessages(where, step, messages) {
  const seen = new Set();
  for (const m of messages) {
    if (typeof m.id !== "string" || m.id === "") problems.push(`${where}: a ${m.role} message without an id: ${JSON.stringify(m)}`);
    else if (seen.has(m.id)) problems.push(`${where}: messages share the id ${m.id}: ${JSON.stringify(messages.filter((x) => x.id === m.id).map(describe))}`);
    seen.add(m.id);
  }
  if (step.messages === undefined) return;
  const conversation = messages.filter((m) => m.role !== "activity");
  const matches = (m, want) => {
    const cut = want.indexOf(": ");
    if (roleOf(m) !== (cut < 0 ? want : want.slice(0, cut))) return false;
    if (cut < 0) return true;
    const text = want.slice(cut + 2);
    return text.endsWith("*") ? textOf(m).startsWith(text.slice(0, -1)) : textOf(m) === text;
  };
  if (conversation.length !== step.messages.length || !conversation.every((m, i) => matches(m, step.messages[i]))) {
    problems.push(`${where}: messages are ${JSON.stringify(conversation.map(describe))}, expected ${JSON.stringify(step.messages)}`);
  }
}

function same(where, what, a, b) {
  const sa = JSON.stringify(a);
  const sb = JSON.stringify(b);
  if (sa !== sb) problems.push(`${where}: ${what} differ: live ${sa} vs connected ${sb}`);
}

async function connectStep(step) {
  const where = `step ${step.index} (connect)`;
  const q = plan.client === "1" ? "?protocolVersion=1.0" : "";
  const url = new URL(`threads/${encodeURIComponent(plan.threadId)}/connect${q}`, plan.url).toString();
  const fresh = new Connecting({ url, threadId: plan.threadId, headers: plan.headers ?? {} });
  const events = [];
  try {
    await fresh.runAgent({ runId: randomUUID() }, { onEvent: ({ event }) => { events.push(event); } });
  } catch (e) {
    problems.push(`${where}: runAgent rejected: ${e?.name}: ${e?.message}`);
  }
  const types = events.map((e) => e.type);
  if (types[0] !== "RUN_STARTED" || types[1] !== "MESSAGES_SNAPSHOT") problems.push(`${where}: starts ${types.slice(0, 2)}`);
  const declared = events[0]?.protocolVersion;
  if (declared !== (plan.client === "1" ? "1.0" : undefined)) problems.push(`${where}: RUN_STARTED declares ${declared}`);
  const last = events[events.length - 1];
  const outcome = last?.type === "RUN_FINISHED" ? last.outcome?.type ?? "success" : last?.type;
  if (outcome !== step.expect) problems.push(`${where}: expected ${step.expect}, got ${outcome}`);
  // What the live agent folded from its runs, the connected one has from the snapshot.
  const view = (ms) => ({
    users: ms.filter((m) => m.role === "user").map((m) => [m.id, m.content]),
    texts: ms.filter((m) => m.role === "assistant" && m.content).map((m) => [m.id, m.content]),
    calls: ms.flatMap((m) => (m.toolCalls ?? []).map((c) => [c.id, c.function.name, c.function.arguments])),
    results: ms.filter((m) => m.role === "tool").map((m) => [m.toolCallId, m.content]),
  });
  const live = view(agent.messages);
  const connected = view(fresh.messages);
  for (const k of Object.keys(live)) same(where, k, live[k], connected[k]);
  if (live.users.length === 0) problems.push(`${where}: the live agent has no messages to compare`);
  const ids = (a) => (a.pendingInterrupts ?? []).map((i) => i.id).sort();
  if (plan.client === "1") same(where, "pending interrupts", ids(agent), ids(fresh));
  if (step.expect === "interrupt" && (last?.outcome?.interrupts ?? []).length === 0) problems.push(`${where}: no interrupts`);
  checkMessages(where, step, fresh.messages);
  report.steps.push({ expect: step.expect, outcome, types, error: null, messages: fresh.messages.map(describe) });
}

let index = 0;
for (const step of plan.steps) {
  step.index = index++;
  if (step.connect) {
    await connectStep(step);
    continue;
  }
  const runId = randomUUID();
  const events = [];
  const params = { runId, forwardedProps: plan.forwardedProps ?? {} };
  if (step.message !== undefined) addUserMessage(step.message);
  if (step.resume !== undefined) {
    const pending = agent.pendingInterrupts ?? [];
    if (pending.length === 0) problems.push(`step ${step.index}: the client has no pending interrupts to resume`);
    // "cancelled", a permission decision ("allow_once"/"deny"), or a payload object.
    params.resume = pending.map((i) =>
      step.resume === "cancelled"
        ? { interruptId: i.id, status: "cancelled" }
        : { interruptId: i.id, status: "resolved",
            payload: typeof step.resume === "object" ? step.resume : { decision: step.resume } },
    );
  }
  const done = { value: false };
  let cancelResult = null;
  const subscriber = { onEvent: ({ event }) => { events.push(event); } };
  const running = agent.runAgent(params, subscriber);
  if (step.cancel) cancelResult = cancelWhenStreaming(events, done);
  let error = null;
  try {
    await running;
  } catch (e) {
    error = e;
    problems.push(`step ${step.index}: runAgent rejected: ${e?.name}: ${e?.message}`);
  }
  done.value = true;
  if (cancelResult) cancelResult = await cancelResult;
  const last = checkStream(step, events, runId);
  const outcome = last?.type === "RUN_ERROR" ? "error" : last?.outcome?.type ?? (last?.type === "RUN_FINISHED" ? "success" : "none");
  if (outcome !== step.expect) problems.push(`step ${step.index}: expected ${step.expect}, got ${outcome} (${last?.code ?? ""} ${last?.message ?? ""})`);
  if (step.expect === "error" && step.code && last?.code !== step.code) {
    problems.push(`step ${step.index}: expected RUN_ERROR ${step.code}, got ${last?.code}`);
  }
  if (outcome === "interrupt") {
    for (const i of last.outcome.interrupts ?? []) {
      if (!i.id || !i.reason || typeof i.responseSchema !== "object" || Array.isArray(i.responseSchema)) {
        problems.push(`step ${step.index}: malformed interrupt ${JSON.stringify(i)}`);
      }
    }
    if ((agent.pendingInterrupts ?? []).length === 0) problems.push(`step ${step.index}: client did not record the interrupts`);
  }
  if (step.cancel && cancelResult?.status !== "cancelled") problems.push(`step ${step.index}: cancel answered ${JSON.stringify(cancelResult)}`);
  checkMessages(`step ${step.index}`, step, agent.messages);
  report.steps.push({ expect: step.expect, outcome, types: events.map((e) => e.type), error: error ? String(error) : null,
    messages: agent.messages.map(describe) });
}

report.ok = problems.length === 0;
report.problems = problems;
process.stdout.write(JSON.stringify(report) + "\n");
process.exit(report.ok ? 0 : 1);
