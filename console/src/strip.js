// What the operations strip and a thread's header say, from the gateway's own answers
// (`GET /health`, `GET /threads/{threadId}`, the `iac-code.session.v1` event). Pure: the page
// writes the text these return.

/** The strip's line from `/health`: versions, kernel state, and (to a signed-in caller of
 * several instances on a shared store) the instance that answered. */
export function healthLine(h) {
  const k = h?.kernel ?? {};
  const parts = [
    `server ${h?.serverVersion ?? "?"}`,
    `AG-UI ${(h?.protocolVersions ?? []).join(", ")}`,
    `kernel ${k.state ?? "?"}${k.size ? ` (${k.size})` : ""}`,
  ];
  if (typeof h?.instance === "string") parts.push(`instance ${h.instance}`);
  return parts.join(" · ");
}

/** Which instance holds a thread, as `GET /threads/{threadId}` says on a shared store (nothing
 * on a gateway of one instance). `here`: the instance `/health` last named. */
export function holderText(t, here) {
  if (!t || !("heldBy" in t)) return "";
  if (t.heldBy === null) return "held by no instance (the next request takes it)";
  return t.heldBy === here ? `held by this instance (${t.heldBy})` : `held by instance ${t.heldBy}`;
}

/** The thread's state line: its run, open interrupts, last run, workspace and holder. */
export function threadLine(t, here) {
  const parts = [];
  if (t?.activeRun) parts.push(`run ${t.activeRun.runId} ${t.activeRun.state}`);
  if (t?.pendingInterrupts?.length) parts.push(`${t.pendingInterrupts.length} open interrupt(s)`);
  if (t?.lastRun) parts.push(`last run ${t.lastRun.outcome}${t.lastRun.code ? ` ${t.lastRun.code}` : ""}`);
  if (t?.binding?.cwd) parts.push(`workspace ${t.binding.cwd}`);
  const holder = holderText(t, here);
  if (holder) parts.push(holder);
  return parts.join(" · ");
}

/** The CUSTOM event naming a run's identities: after RUN_STARTED and again whenever its task or
 * session id becomes known (each carries every id, null while unknown). */
export const SESSION_EVENT = "iac-code.session.v1";

/** The thread's session line, from the last `iac-code.session.v1` value: the ids known so far,
 * in the order they become known (the line grows at its end as a run goes on). */
export function sessionLine(s) {
  const parts = [];
  if (s?.executionId) parts.push(`execution ${s.executionId}`);
  if (s?.taskId) parts.push(`task ${s.taskId}`);
  if (s?.sessionId) parts.push(`session ${s.sessionId}`);
  return parts.join(" · ");
}
