// The gateway's routes as the console calls them: always its own origin, with the sign-in kept in
// this module's memory only (never in storage), and the preset (no secret in it) remembered.

const PRESET_KEY = "iac-console-preset";

const memory = { token: "", actAs: "" };

/** The configuration the gateway wrote into the page: `{auth: "none" | "bearer"}`. */
export function pageConfig() {
  const meta = document.querySelector('meta[name="iac-console"]');
  try {
    return JSON.parse(meta?.content ?? "{}");
  } catch {
    return {};
  }
}

export function signIn(token, actAs) {
  memory.token = token.trim();
  memory.actAs = actAs.trim();
}

export function signedIn() {
  return pageConfig().auth !== "bearer" || memory.token !== "";
}

/** The headers of every call: the bearer token and the user a service token acts for. */
export function authHeaders() {
  const h = {};
  if (memory.token) h.Authorization = `Bearer ${memory.token}`;
  if (memory.actAs) h["X-Iac-Code-User"] = memory.actAs;
  return h;
}

/** The gateway's root URL (the page is at `/console/`). */
export function root() {
  return new URL("../", location.href).toString();
}

export function loadPreset() {
  try {
    const p = JSON.parse(localStorage.getItem(PRESET_KEY) ?? "{}");
    return { cwd: p.cwd ?? "", rosInvocationId: p.rosInvocationId ?? "", model: p.model ?? "" };
  } catch {
    return { cwd: "", rosInvocationId: "", model: "" };
  }
}

export function savePreset(p) {
  // Only these three fields: a key or a header never reaches storage.
  const kept = { cwd: p.cwd, rosInvocationId: p.rosInvocationId, model: p.model };
  localStorage.setItem(PRESET_KEY, JSON.stringify(kept));
}

/**
 * `forwardedProps.iacCode` of a thread's runs, from the preset (empty fields left out). The
 * gateway needs a `rosInvocationId`: without one in the preset, the thread's own
 * (`console-<threadId>`, the same for all its runs).
 */
export function iacCodeOf(p, threadId) {
  const out = { rosInvocationId: p.rosInvocationId || `console-${threadId}` };
  if (p.cwd) out.cwd = p.cwd;
  if (p.model) out.model = p.model;
  return out;
}

/** A JSON call of the gateway; throws an Error with the gateway's code and message. */
export async function call(path, init = {}) {
  const res = await fetch(new URL(path, root()), {
    ...init,
    headers: { Accept: "application/json", ...authHeaders(), ...(init.headers ?? {}) },
  });
  const text = await res.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : null;
  } catch {
    body = null;
  }
  if (!res.ok) {
    const e = new Error(body?.error?.message ?? `HTTP ${res.status}`);
    e.status = res.status;
    e.code = body?.error?.code ?? `HTTP_${res.status}`;
    throw e;
  }
  return body;
}
