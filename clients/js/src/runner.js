// IacCodeAgentRunner: a CopilotKit AgentRunner (`run`, `connect`, `isRunning`, `stop`) that keeps
// nothing of a thread itself. CopilotKit's runtime answers `POST /agent/:id/connect` from its
// runner, never from the agent, and its default runner keeps every thread's events in the
// process's memory (lost on a restart, not shared by two instances). This one asks the gateway:
//   * run: the agent's own run (an IacCodeAgent streams it from the gateway), its events passed on;
//   * connect: GET /threads/{threadId}/connect (the thread's messages, pending interrupts and its
//     running run, from whichever runtime instance asks);
//   * isRunning: GET /threads/{threadId} (`activeRun`);
//   * stop: the gateway's cancellation route, for a run this runner started (the execution is
//     named by the run's `iac-code.session.v1` event).
// The shapes are those of @copilotkit/runtime's AgentRunner; it is not imported, so the package
// does not depend on CopilotKit.

import { Observable } from "rxjs";
import { sseEvents } from "./agent.js";

export class IacCodeAgentRunner {
  /**
   * @param {{url: string, headers?: Record<string,string>, fetch?: typeof fetch,
   *          protocolVersion?: string, forwardHeaders?: string[]}} options
   */
  constructor(options) {
    this.url = options.url;
    this.headers = { ...(options.headers ?? {}) };
    this.fetch = options.fetch ?? ((u, i) => fetch(u, i));
    this.protocolVersion = options.protocolVersion;
    // Headers of the browser's request passed on to the gateway by connect (its user's token).
    this.forwardHeaders = (options.forwardHeaders ?? ["authorization"]).map((h) => h.toLowerCase());
    // threadId → {executionId, rosInvocationId} of the run this runner has going.
    this.running = new Map();
  }

  route(path) {
    return new URL(path, this.url).toString();
  }

  run({ threadId, agent, input }) {
    return new Observable((subscriber) => {
      const sub = agent.run(input).subscribe({
        next: (event) => {
          if (event.type === "CUSTOM" && event.name === "iac-code.session.v1" && event.value?.executionId) {
            this.running.set(threadId, {
              executionId: event.value.executionId,
              rosInvocationId: event.value.rosInvocationId,
            });
          }
          subscriber.next(event);
        },
        error: (e) => {
          this.running.delete(threadId);
          subscriber.error(e);
        },
        complete: () => {
          this.running.delete(threadId);
          subscriber.complete();
        },
      });
      return () => sub.unsubscribe();
    });
  }

  connect({ threadId, headers }) {
    const q = this.protocolVersion ? `?protocolVersion=${encodeURIComponent(this.protocolVersion)}` : "";
    const url = this.route(`threads/${encodeURIComponent(threadId)}/connect${q}`);
    const passed = Object.fromEntries(
      Object.entries(headers ?? {}).filter(([k]) => this.forwardHeaders.includes(k.toLowerCase())),
    );
    return new Observable((subscriber) => {
      const abort = new AbortController();
      (async () => {
        const res = await this.fetch(url, {
          method: "GET",
          headers: { ...this.headers, ...passed, Accept: "text/event-stream" },
          signal: abort.signal,
        });
        // A thread the gateway does not know (or the caller may not see) has nothing to replay.
        if (res.status === 404) return subscriber.complete();
        if (!res.ok) throw new Error(`HTTP ${res.status}: ${await res.text().catch(() => "")}`);
        for await (const { data } of sseEvents(res.body)) subscriber.next(JSON.parse(data));
        subscriber.complete();
      })().catch((e) => {
        if (!abort.signal.aborted) subscriber.error(e);
      });
      return () => abort.abort();
    });
  }

  async isRunning({ threadId }) {
    const res = await this.fetch(this.route(`threads/${encodeURIComponent(threadId)}`), {
      headers: { ...this.headers, Accept: "application/json" },
    });
    if (res.status === 404) return false;
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const thread = await res.json();
    return thread.activeRun != null;
  }

  async stop({ threadId }) {
    const run = this.running.get(threadId);
    if (!run) return false;
    const res = await this.fetch(
      this.route(`extensions/iac-code/v1/executions/${encodeURIComponent(run.executionId)}/cancel`),
      {
        method: "POST",
        headers: { ...this.headers, "Content-Type": "application/json" },
        body: JSON.stringify({ threadId, rosInvocationId: run.rosInvocationId }),
      },
    );
    if (!res.ok) return false;
    const answer = await res.json();
    return answer.status === "cancelled";
  }
}
