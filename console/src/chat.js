import { check } from "./schema.js";
import { SESSION_EVENT } from "./strip.js";

// The chat: AG-UI events drawn as a conversation (text, reasoning, tool calls with their
// arguments and results, the gateway's CUSTOM events as what they mean, the run's outcome), a
// thread's history from a MESSAGES_SNAPSHOT, and open interrupts as forms. The session event is
// not drawn here: its ids are the thread's, shown once in its header (main.js).

const list = () => document.getElementById("messages");
const byId = new Map();

function item(kind, label) {
  const li = document.createElement("li");
  li.className = kind;
  if (label) {
    const h = document.createElement("span");
    h.className = "who";
    h.textContent = label;
    li.append(h);
  }
  list().append(li);
  li.scrollIntoView({ block: "nearest" });
  return li;
}

function textBlock(li) {
  const p = document.createElement("div");
  p.className = "text";
  li.append(p);
  return p;
}

export function clearChat() {
  list().replaceChildren();
  byId.clear();
}

export function userMessage(text) {
  textBlock(item("user", "you")).textContent = text;
}

/** What the gateway's own CUSTOM events mean, in a line. */
export function customLine(name, value) {
  const v = value ?? {};
  switch (name) {
    case "iac-code.artifact.v1":
      return `artifact ${v.name ?? v.artifactId ?? ""}`.trim();
    case "iac-code.tool-progress.v1":
      return `tool progress ${v.message ?? v.status ?? ""}`.trim();
    case "iac-code.pipeline.v1":
      return `pipeline ${v.type ?? v.eventType ?? ""} ${v.stepName ?? v.step ?? ""}`.trim();
    default:
      return `${name}: ${JSON.stringify(value).slice(0, 200)}`;
  }
}

function usageLine(usage) {
  if (!Array.isArray(usage) || usage.length === 0) return "";
  const sum = (k) => usage.reduce((n, u) => n + (u[k] ?? 0), 0);
  return ` · ${sum("inputTokens")} tokens in, ${sum("outputTokens")} out`;
}

function toolItem(id, name) {
  const li = item("tool", `tool ${name}`);
  const d = document.createElement("details");
  const s = document.createElement("summary");
  s.textContent = "arguments and result";
  const args = document.createElement("pre");
  args.className = "args";
  const result = document.createElement("pre");
  result.className = "result";
  d.append(s, args, result);
  li.append(d);
  const t = { li, args, result, argText: "" };
  byId.set(`tool:${id}`, t);
  return t;
}

function reasoningItem(id) {
  const li = item("reasoning");
  const d = document.createElement("details");
  const s = document.createElement("summary");
  s.textContent = "reasoning";
  const body = document.createElement("div");
  body.className = "text";
  d.append(s, body);
  li.append(d);
  const r = { li, body };
  byId.set(`reasoning:${id}`, r);
  return r;
}

/** Draws one AG-UI event. */
export function onEvent(e) {
  switch (e.type) {
    case "TEXT_MESSAGE_START":
      byId.set(`text:${e.messageId}`, textBlock(item("assistant", "agent")));
      break;
    case "TEXT_MESSAGE_CONTENT": {
      const el = byId.get(`text:${e.messageId}`) ?? textBlock(item("assistant", "agent"));
      byId.set(`text:${e.messageId}`, el);
      el.textContent += e.delta;
      break;
    }
    case "REASONING_MESSAGE_START":
    case "THINKING_TEXT_MESSAGE_START":
      reasoningItem(e.messageId ?? "thinking");
      break;
    case "REASONING_MESSAGE_CONTENT":
    case "THINKING_TEXT_MESSAGE_CONTENT": {
      const key = e.messageId ?? "thinking";
      const r = byId.get(`reasoning:${key}`) ?? reasoningItem(key);
      r.body.textContent += e.delta;
      break;
    }
    case "TOOL_CALL_START":
      toolItem(e.toolCallId, e.toolCallName);
      break;
    case "TOOL_CALL_ARGS": {
      const t = byId.get(`tool:${e.toolCallId}`) ?? toolItem(e.toolCallId, "?");
      t.argText += e.delta;
      t.args.textContent = t.argText;
      break;
    }
    case "TOOL_CALL_RESULT": {
      const t = byId.get(`tool:${e.toolCallId}`) ?? toolItem(e.toolCallId, "?");
      t.result.textContent = typeof e.content === "string" ? e.content : JSON.stringify(e.content);
      break;
    }
    case "CUSTOM":
      // Several session events come in a run (as its ids become known): lines of them would
      // sit between the messages, repeating the same ids.
      if (e.name !== SESSION_EVENT) item("custom").textContent = customLine(e.name, e.value);
      break;
    case "MESSAGES_SNAPSHOT":
      history(e.messages ?? []);
      break;
    case "RUN_FINISHED": {
      const o = e.outcome?.type ?? "success";
      const what = { interrupt: "waiting for your answer", cancelled: "run cancelled" }[o] ?? "run finished";
      item(`outcome ${o}`).textContent = what + usageLine(e.usage);
      break;
    }
    case "RUN_ERROR":
      item("outcome error").textContent = `error ${e.code ?? ""}: ${e.message ?? ""}`.trim() + usageLine(e.usage);
      break;
    default:
      break;
  }
}

/** A thread's history (a snapshot, or the transcript's messages), drawn anew. */
export function history(messages) {
  clearChat();
  for (const m of messages) {
    const content = typeof m.content === "string" ? m.content
      : Array.isArray(m.content) ? m.content.map((p) => p.text ?? `[${p.type}]`).join("") : "";
    if (m.role === "user") userMessage(content);
    else if (m.role === "assistant") {
      if (content) textBlock(item("assistant", "agent")).textContent = content;
      for (const c of m.toolCalls ?? []) {
        const t = toolItem(c.id, c.function?.name ?? "?");
        t.args.textContent = c.function?.arguments ?? "";
      }
    } else if (m.role === "tool") {
      const t = byId.get(`tool:${m.toolCallId}`) ?? toolItem(m.toolCallId, "?");
      t.result.textContent = content;
    } else if (m.role === "reasoning") {
      reasoningItem(m.id).body.textContent = content;
    }
  }
}

/** The choices an interrupt's schema offers: `[{value, title}]` buttons, and free text or not. */
export function choicesOf(i) {
  const s = i.responseSchema ?? {};
  const decision = s.properties?.decision;
  if (Array.isArray(decision?.enum)) {
    const titles = Object.fromEntries((i.metadata?.standardOptions ?? []).map((o) => [o.id, o.title]));
    return {
      buttons: decision.enum.map((v) => ({ payload: { decision: v }, title: titles[v] ?? v.replaceAll("_", " ") })),
      freeText: false,
    };
  }
  if (Array.isArray(s.oneOf)) {
    const buttons = [];
    let freeText = false;
    for (const b of s.oneOf) {
      const sel = b.properties?.selectedId;
      if (sel?.const !== undefined) buttons.push({ payload: { selectedId: sel.const }, title: sel.title ?? sel.const });
      else if (b.properties?.freeText) freeText = true;
    }
    return { buttons, freeText };
  }
  return null;
}

/**
 * Shows the open interrupts as forms and resolves with one answer for every one of them (the
 * resume).
 */
export function askInterrupts(interrupts) {
  const box = document.getElementById("interrupts");
  box.hidden = false;
  box.replaceChildren();
  const answers = interrupts.map((i) => new Promise((done) => {
    const form = document.createElement("form");
    form.className = "interrupt";
    form.dataset.interruptId = i.id;
    const p = document.createElement("p");
    p.textContent = i.message ?? i.reason ?? "The agent asks:";
    form.append(p);
    if (i.expiresAt) {
      const c = document.createElement("p");
      c.className = "countdown";
      const tick = () => {
        const left = Math.max(0, Math.round((Date.parse(i.expiresAt) - Date.now()) / 1000));
        c.textContent = `expires in ${left} s`;
        if (left > 0 && form.isConnected) setTimeout(tick, 1000);
      };
      tick();
      form.append(c);
    }
    const finish = (payload) => {
      for (const el of form.elements) el.disabled = true;
      done({ interruptId: i.id, status: "resolved", payload });
    };
    const choices = choicesOf(i);
    for (const b of choices?.buttons ?? []) {
      const btn = document.createElement("button");
      btn.type = "button";
      btn.className = "choice";
      btn.dataset.payload = JSON.stringify(b.payload);
      btn.textContent = b.title;
      btn.addEventListener("click", () => finish(b.payload), { once: true });
      form.append(btn);
    }
    if (choices?.freeText || !choices) {
      const label = document.createElement("label");
      label.textContent = choices ? "Or answer in your words" : "Answer (JSON matching the interrupt's schema)";
      const input = document.createElement("textarea");
      input.rows = choices ? 2 : 4;
      label.append(input);
      const send = document.createElement("button");
      send.type = "submit";
      send.textContent = "Answer";
      const err = document.createElement("p");
      err.className = "error";
      form.append(label, send, err);
      form.addEventListener("submit", (ev) => {
        ev.preventDefault();
        if (choices) {
          if (input.value.trim()) finish({ freeText: input.value });
          return;
        }
        let answer;
        try {
          answer = JSON.parse(input.value);
        } catch (e) {
          err.textContent = `Not JSON: ${e.message}`;
          return;
        }
        const wrong = check(i.responseSchema, answer);
        if (wrong) err.textContent = wrong;
        else finish(answer);
      });
    } else {
      form.addEventListener("submit", (ev) => ev.preventDefault());
    }
    box.append(form);
  }));
  return Promise.all(answers).then((all) => {
    box.hidden = true;
    box.replaceChildren();
    return all;
  });
}
