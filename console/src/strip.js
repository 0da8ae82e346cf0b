// What the operations strip and a thread's state line say, from the gateway's own answers
// (`GET /health`, `GET /threads/{threadId}`). Pure: the page writes the text these return.

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
