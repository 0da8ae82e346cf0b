// The console: one page, served by the gateway itself (`--console`), that runs the official
// `@ag-ui/client` 1.0.0 (through this repository's `IacCodeAgent`) against the gateway's own
// routes. Nothing leaves the gateway's origin; the bearer token lives in memory only.

import "./jitless.js";
import { IacCodeAgent } from "../../clients/js/src/index.js";
import * as api from "./api.js";
import * as chat from "./chat.js";
import * as frames from "./frames.js";
import { SESSION_EVENT, healthLine, sessionLine, threadLine } from "./strip.js";

const $ = (id) => document.getElementById(id);
const state = {
  agent: null,
  threadId: null,
  running: false,
  session: null,
  // What a test (or a curious person) can read: the runs' outcomes, in order.
  runs: [],
};
window.__console = state;

// The official client's own complaints ("[ag-ui] …" warnings) are shown next to the frame they
// concern, as its errors are.
const warn = console.warn.bind(console);
console.warn = (...args) => {
  const text = args.map(String).join(" ");
  if (text.startsWith("[ag-ui]")) frames.noteLast(text);
  warn(...args);
};

function status(text) {
  $("run-status").textContent = text;
}

/**
 * The open thread's session (the last `iac-code.session.v1` value, or none): one line in its
 * header, rewritten in place as a later event adds the task or session id; what Cancel execution
 * cancels.
 */
function showSession(s) {
  state.session = s;
  $("thread-session").textContent = sessionLine(s);
  $("cancel-execution").disabled = !s?.executionId;
}

function newAgent(threadId, follow = false) {
  state.threadId = threadId;
  showSession(null);
  $("archive-thread").disabled = false;
  state.agent = new IacCodeAgent({
    url: api.root(),
    threadId,
    headers: api.authHeaders(),
    fetch: frames.tappingFetch,
    // Connect keeps the stream open and shows the thread's later runs as they start.
    follow,
    iacCode: api.iacCodeOf(api.loadPreset(), threadId),
  });
  return state.agent;
}

function subscriber() {
  return {
    onEvent: ({ event }) => {
      if (event.type === "CUSTOM" && event.name === SESSION_EVENT) showSession(event.value);
      chat.onEvent(event);
    },
  };
}

/** Runs the agent once (a turn, a resume or a connect) and answers interrupts until it ends. */
async function drive(params, how = "run") {
  state.running = true;
  state.stopped = false;
  $("stop").disabled = false;
  $("send").disabled = true;
  let outcome = "none";
  try {
    for (;;) {
      const agent = state.agent;
      agent.headers = api.authHeaders();
      const result = how === "connect"
        ? await agent.connectAgent({}, subscriber())
        : await agent.runAgent({ runId: crypto.randomUUID(), ...params }, subscriber());
      const open = agent.pendingInterrupts ?? [];
      outcome = open.length > 0 ? "interrupt" : result?.outcome?.type ?? "success";
      state.runs.push({ how, outcome });
      if (open.length === 0) break;
      status(`${open.length} interrupt(s) waiting for your answer`);
      const resume = await chat.askInterrupts(open);
      params = { resume };
      how = "run";
    }
    status(outcome === "none" ? "" : `last run: ${outcome}`);
  } catch (e) {
    if (state.stopped) {
      state.runs.push({ how, outcome: "stopped" });
      return;
    }
    const why = `${e?.code ?? e?.name ?? "Error"}: ${e?.message ?? e}`;
    frames.noteLast(why);
    state.runs.push({ how, outcome: "error", error: why });
    status(`failed: ${why}`);
  } finally {
    state.running = false;
    $("stop").disabled = true;
    $("send").disabled = false;
    $("rename").hidden = !state.threadId;
    refreshThreads();
    threadState();
  }
}

async function send(ev) {
  ev.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || state.running) return;
  if (!api.signedIn()) {
    openSettings("Sign in first: this gateway asks for a bearer token.");
    return;
  }
  if (!state.agent) newAgent(crypto.randomUUID());
  $("prompt").value = "";
  chat.userMessage(text);
  state.agent.addMessage({ id: crypto.randomUUID(), role: "user", content: text });
  $("thread-title").textContent = text.split("\n")[0].slice(0, 120);
  await drive({});
}

/**
 * Cancel execution: the thread's kernel task, through the cancellation extension (the run's
 * execution id and invocation come from its `iac-code.session.v1` event).
 */
async function cancelExecution() {
  const s = state.session;
  if (!s?.executionId) return;
  try {
    const r = await api.call(`extensions/iac-code/v1/executions/${encodeURIComponent(s.executionId)}/cancel`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ threadId: s.threadId, rosInvocationId: s.rosInvocationId }),
    });
    status(`execution ${r?.status ?? "cancelled"}`);
  } catch (e) {
    status(`cancel: ${e.code}: ${e.message}`);
  }
}

async function patchThread(patch) {
  return api.call(`threads/${encodeURIComponent(state.threadId)}`, {
    method: "PATCH",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(patch),
  });
}

/** Archives the open thread, or brings an archived one back to the list. */
async function archiveThread() {
  if (!state.threadId || state.running) return;
  const archived = !state.archived;
  try {
    await patchThread({ archived });
    status(archived ? "thread archived" : "thread restored");
    newThread();
    refreshThreads();
  } catch (e) {
    status(`archive: ${e.code}: ${e.message}`);
  }
}

async function rename(ev) {
  ev.preventDefault();
  const title = $("new-title").value.trim();
  if (!title || !state.threadId) return;
  try {
    const t = await patchThread({ title });
    $("thread-title").textContent = t?.title ?? title;
    status("thread renamed");
    refreshThreads();
  } catch (e) {
    status(`rename: ${e.code}: ${e.message}`);
  }
}

/** Where the open thread stands, as the gateway says (`GET /threads/{id}`). */
async function threadState() {
  if (!state.threadId) return;
  try {
    const t = await api.call(`threads/${encodeURIComponent(state.threadId)}`);
    $("thread-state").textContent = threadLine(t, state.instance);
  } catch (e) {
    $("thread-state").textContent = e.status === 404 ? "" : `${e.code}: ${e.message}`;
  }
}

/**
 * Stop: the connection is dropped, and the gateway cancels the run (cancel on disconnect); a
 * followed thread is no longer followed (its runs go on).
 */
function stop() {
  state.stopped = true;
  state.agent?.abortRun();
  status("stopped");
}

async function openThread(t) {
  if (state.running) return;
  newAgent(t.threadId, $("follow").checked);
  state.archived = t.archived === true;
  $("archive-thread").textContent = state.archived ? "Restore thread" : "Archive thread";
  $("rename").hidden = false;
  chat.clearChat();
  $("thread-title").textContent = t.title ?? t.threadId;
  threadState();
  // The thread as the gateway keeps it: its history, then its running run if any.
  await drive({}, "connect");
}

function newThread() {
  if (state.running) return;
  state.agent = null;
  state.threadId = null;
  showSession(null);
  state.archived = false;
  $("archive-thread").disabled = true;
  $("archive-thread").textContent = "Archive thread";
  $("rename").hidden = true;
  $("thread-state").textContent = "";
  chat.clearChat();
  $("thread-title").textContent = "New thread";
  $("prompt").focus();
}

/**
 * What the gateway can do (`GET /capabilities`): a thread's later runs can be followed only when
 * runs are buffered (`--detach-grace`, "resumable").
 */
async function capabilities() {
  try {
    const caps = await api.call("capabilities");
    const resumable = caps?.transport?.resumable === true;
    $("follow").disabled = !resumable;
    if (!resumable) $("follow").checked = false;
    $("follow-note").textContent = resumable ? "" : "Following needs the gateway's --detach-grace.";
  } catch {
    // Capabilities are a convenience: without them everything else still works.
  }
}

let threads = [];
async function refreshThreads() {
  if (!api.signedIn()) {
    $("threads-note").textContent = "Sign in (Settings) to see your threads.";
    return;
  }
  try {
    const archived = $("show-archived").checked;
    const page = await api.call(`threads?limit=100${archived ? "&archived=true" : ""}`);
    threads = page?.threads ?? [];
    $("threads-note").textContent = page?.nextCursor ? "The newest 100 threads." : "";
    drawThreads();
  } catch (e) {
    $("threads-note").textContent = `Threads: ${e.code}: ${e.message}`;
  }
}

function drawThreads() {
  const q = $("thread-search").value.trim().toLowerCase();
  $("thread-list").replaceChildren(
    ...threads
      .filter((t) => !q || (t.title ?? "").toLowerCase().includes(q))
      .map((t) => {
        const li = document.createElement("li");
        const b = document.createElement("button");
        b.type = "button";
        b.className = "thread";
        b.dataset.threadId = t.threadId;
        const extra = [t.activeRun ? "running" : "", t.pendingInterrupts ? `${t.pendingInterrupts} open` : ""]
          .filter(Boolean)
          .join(", ");
        b.textContent = `${t.title ?? t.threadId}${extra ? ` (${extra})` : ""}`;
        b.addEventListener("click", () => openThread(t));
        li.append(b);
        return li;
      }),
  );
}

async function health() {
  try {
    // With the sign-in: a caller who may use the gateway also learns which instance answered.
    const h = await api.call("health");
    state.instance = typeof h?.instance === "string" ? h.instance : undefined;
    $("health").textContent = healthLine(h);
  } catch (e) {
    $("health").textContent = `health: ${e.message}`;
  }
}

function openSettings(why) {
  const s = $("settings");
  s.hidden = false;
  $("settings-toggle").setAttribute("aria-expanded", "true");
  if (why) status(why);
  $("token").focus();
}

function setUp() {
  const cfg = api.pageConfig();
  const p = api.loadPreset();
  $("cwd").value = p.cwd;
  $("ros").value = p.rosInvocationId;
  $("model").value = p.model;
  $("settings-toggle").addEventListener("click", () => {
    const s = $("settings");
    s.hidden = !s.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!s.hidden));
  });
  $("settings").addEventListener("submit", (ev) => {
    ev.preventDefault();
    api.signIn($("token").value, $("act-as").value);
    api.savePreset({ cwd: $("cwd").value.trim(), rosInvocationId: $("ros").value.trim(), model: $("model").value.trim() });
    if (state.agent) state.agent.iacCode = api.iacCodeOf(api.loadPreset(), state.threadId);
    $("settings").hidden = true;
    $("settings-toggle").setAttribute("aria-expanded", "false");
    status("settings saved");
    health();
    refreshThreads();
    capabilities();
  });
  $("composer").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
  });
  $("stop").addEventListener("click", stop);
  $("cancel-execution").addEventListener("click", cancelExecution);
  $("archive-thread").addEventListener("click", archiveThread);
  $("new-thread").addEventListener("click", newThread);
  $("refresh-threads").addEventListener("click", refreshThreads);
  $("thread-search").addEventListener("input", drawThreads);
  $("show-archived").addEventListener("change", refreshThreads);
  $("rename").addEventListener("submit", rename);
  $("frame-filter").addEventListener("input", (e) => frames.setFilter(e.target.value));
  $("export-frames").addEventListener("click", frames.exportFile);
  $("clear-frames").addEventListener("click", frames.clear);
  if (cfg.metrics) {
    // The admin listener serves the page and `/metrics` on one origin.
    $("metrics-link").href = new URL("metrics", api.root()).toString();
    $("metrics-link").hidden = false;
  }
  health();
  setInterval(health, 15000);
  if (cfg.auth === "bearer") openSettings("This gateway asks for a bearer token.");
  else {
    refreshThreads();
    capabilities();
  }
}

setUp();
