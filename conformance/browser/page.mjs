// The browser page: a minimal AG-UI front end on the official client (`HttpAgent`, the browser's
// own fetch and streams), talking to the gateway cross-origin with a bearer token.
//
// Config: `?cfg=<JSON>` {url, token, threadId, forwardedProps, messages: [text, ...], mode?,
// dropAfter?}.
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

// "reattach" mode: a run started with fetch, dropped after a few events, then followed again
// with the browser's own EventSource from the id last seen (`?after=`).
async function reattach() {
  const rec = { resume: false, types: [], ids: [], runStarted: null, last: null, outcome: "none", error: null, opens: 0 };
  const runId = crypto.randomUUID();
  const body = {
    threadId: cfg.threadId, runId, state: {}, tools: [], context: [], forwardedProps: cfg.forwardedProps,
    messages: [{ id: crypto.randomUUID(), role: "user", content: cfg.messages[0] }],
  };
  const abort = new AbortController();
  const events = [];
  try {
    const r = await fetch(cfg.url, {
      method: "POST", signal: abort.signal, body: JSON.stringify(body),
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
    });
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    // Whole blocks only, as a client handles them: `id: <n>` then `data: <json>`.
    while (events.length < cfg.dropAfter) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      let end;
      while ((end = text.indexOf("\n\n")) >= 0 && events.length < cfg.dropAfter) {
        const block = text.slice(0, end);
        text = text.slice(end + 2);
        const id = block.match(/^id: (\d+)$/m);
        const data = block.match(/^data: (.*)$/m);
        if (data) events.push({ id: Number(id?.[1]), event: JSON.parse(data[1]) });
      }
    }
    abort.abort();
  } catch (e) {
    if (e?.name !== "AbortError") rec.error = `${e?.name}: ${e?.message}`;
  }
  const after = events.at(-1)?.id ?? 0;
  // The EventSource is left to run its course: after the terminal event the gateway ends the
  // stream, the EventSource reconnects with `Last-Event-ID` (the terminal event's id, which wins
  // over the URL's `after`), and the gateway's 204 tells it the run is over: it closes for good.
  await new Promise((done) => {
    const es = new EventSource(`${cfg.url}threads/${encodeURIComponent(cfg.threadId)}/runs/${runId}/events?after=${after}`);
    es.onopen = () => { rec.opens++; };
    es.onmessage = (m) => {
      events.push({ id: Number(m.lastEventId), event: JSON.parse(m.data) });
    };
    es.onerror = () => {
      if (es.readyState === EventSource.CLOSED) done();
    };
  });
  rec.types = events.map((e) => e.event.type);
  rec.ids = events.map((e) => e.id);
  rec.runStarted = events.find((e) => e.event.type === "RUN_STARTED")?.event ?? null;
  rec.last = events.at(-1)?.event ?? null;
  rec.dropAfter = after;
  const last = rec.last;
  rec.outcome = last?.type === "RUN_ERROR" ? "error"
    : last?.type === "RUN_FINISHED" ? last.outcome?.type ?? "success" : "none";
  state.runs.push(rec);
  say(`reattached run: ${rec.outcome}`);
}

try {
  if (cfg.mode === "reattach") {
    await reattach();
  } else {
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
  }
} finally {
  state.done = true;
}
