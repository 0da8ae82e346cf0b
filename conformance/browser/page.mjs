// The browser page: a minimal AG-UI front end on the official client (`HttpAgent`, the browser's
// own fetch and streams), talking to the gateway cross-origin with a bearer token.
//
// Config: `?cfg=<JSON>` {url, token, threadId, forwardedProps, messages: [text, ...]}.
// Each message is one turn. A turn that ends in interrupts renders one "Allow" button per pending
// interrupt; once all are clicked (by a person, or by drive.mjs) the page resumes the run with
// `allow_once`. What the page saw is published on `window.__agui` for the driver:
// {client, runs: [{resume, types, runStarted, last, outcome, error}], done}.

import { HttpAgent } from "agui-client";

const state = { client: __AGUI_CLIENT__, runs: [], done: false };
window.__agui = state;
const cfg = JSON.parse(new URLSearchParams(location.search).get("cfg"));
const app = document.getElementById("app");
const agent = new HttpAgent({
  url: cfg.url,
  threadId: cfg.threadId,
  // A non-simple header: every POST is preceded by a CORS preflight.
  headers: { Authorization: `Bearer ${cfg.token}` },
});

function say(text) {
  const p = document.createElement("p");
  p.textContent = text;
  app.append(p);
}

async function run(params) {
  const events = [];
  const rec = { resume: params.resume !== undefined, types: [], runStarted: null, last: null, outcome: "none", error: null };
  try {
    await agent.runAgent(
      { runId: crypto.randomUUID(), forwardedProps: cfg.forwardedProps, ...params },
      { onEvent: ({ event }) => { events.push(event); } },
    );
  } catch (e) {
    rec.error = `${e?.name}: ${e?.message}`;
  }
  rec.types = events.map((e) => e.type);
  rec.runStarted = events.find((e) => e.type === "RUN_STARTED") ?? null;
  rec.last = events.at(-1) ?? null;
  const last = rec.last;
  rec.outcome = last?.type === "RUN_ERROR" ? "error"
    : last?.type === "RUN_FINISHED" ? last.outcome?.type ?? "success" : "none";
  state.runs.push(rec);
  say(`run ${state.runs.length}: ${rec.outcome}${rec.error ? ` (${rec.error})` : ""}`);
  return rec;
}

// Resolves with the resume entries once every pending interrupt's button was clicked.
function askUser(interrupts) {
  return Promise.all(interrupts.map((i) => new Promise((done) => {
    const b = document.createElement("button");
    b.className = "allow";
    b.dataset.interruptId = i.id;
    b.textContent = `Allow: ${i.message ?? i.reason}`;
    b.addEventListener("click", () => {
      b.disabled = true;
      done({ interruptId: i.id, status: "resolved", payload: { decision: "allow_once" } });
    }, { once: true });
    app.append(b);
  })));
}

try {
  for (const text of cfg.messages) {
    const msg = { id: crypto.randomUUID(), role: "user", content: text };
    if (typeof agent.addMessage === "function") agent.addMessage(msg);
    else agent.messages.push(msg);
    let rec = await run({});
    while (rec.outcome === "interrupt" && (agent.pendingInterrupts ?? []).length > 0) {
      rec = await run({ resume: await askUser(agent.pendingInterrupts) });
    }
    if (rec.error) break;
  }
} finally {
  state.done = true;
}
