// IacCodeAgent, made from the @ag-ui/client module it extends (1.0.x or 0.0.59): the same code
// serves both, and the tests run it against 1.0.0 and 0.0.59.
//
// What it adds to HttpAgent:
//   * forwardedProps.iacCode filled from the `iacCode` option (a run's own values win);
//   * client tools are not sent: the gateway refuses them (400), and the agent cannot call a
//     browser's functions. CopilotKit sends its frontend actions and suggestions as tools; with
//     this agent they stay in the browser and the iac-code agent never sees them;
//   * connect(): GET {url}threads/{threadId}/connect (the thread as a run of its own, then the
//     running run, then, with `follow`, later runs), which connectAgent() applies, again and
//     again on a thread that waits for an answer (the pending interrupts are the gateway's);
//   * getCapabilities(): GET {url}capabilities;
//   * a stream that breaks before its run ended is re-attached with Last-Event-ID (the run's
//     events route for a run, the connect route for a connect), a few times, waiting a little
//     longer each time. It needs the gateway's --detach-grace: without it the run was cancelled
//     when the stream broke, and re-attaching fails with the gateway's error.

import { Observable } from "rxjs";

const TERMINAL = new Set(["RUN_FINISHED", "RUN_ERROR"]);

/** Splits an SSE body into its events: `{id, data}` (comments and heartbeats skipped). */
export async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  // A CR at the end of a chunk may be the first half of a CRLF: it waits for the next chunk.
  let carry = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      let raw = carry + decoder.decode(value, { stream: true });
      carry = raw.endsWith("\r") ? "\r" : "";
      if (carry) raw = raw.slice(0, -1);
      buffer += raw.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let id;
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let v = colon < 0 ? "" : line.slice(colon + 1);
          if (v.startsWith(" ")) v = v.slice(1);
          if (field === "id") id = v;
          else if (field === "data") data.push(v);
        }
        if (data.length > 0) yield { id, data: data.join("\n") };
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** An HTTP answer that is not a stream, as an error carrying the gateway's code. */
async function httpError(res) {
  const text = await res.text().catch(() => "");
  let code;
  let message = text;
  try {
    const j = JSON.parse(text);
    code = j?.error?.code;
    message = j?.error?.message ?? text;
  } catch {}
  const e = new Error(`HTTP ${res.status}${code ? ` ${code}` : ""}: ${message}`);
  e.status = res.status;
  e.code = code;
  return e;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function makeIacCodeAgent(agui) {
  const { HttpAgent } = agui;
  // 1.0 declares its protocol version; the 0.0.x clients speak the protocol before it.
  const isV1 = typeof agui.enforceEvents === "function";
  const outgoing = typeof agui.enforceOutgoingInput === "function" ? agui.enforceOutgoingInput : (i) => i;

  return class IacCodeAgent extends HttpAgent {
    constructor(config) {
      super(config);
      // (0.0.59 and 1.0.0 keep `fetch` themselves; set here for any that does not.)
      if (config.fetch) this.fetch = config.fetch;
      this.iacCode = { ...(config.iacCode ?? {}) };
      this.follow = config.follow === true;
      this.reattachAttempts = config.reattachAttempts ?? 5;
      this.reattachDelayMs = config.reattachDelayMs ?? 500;
    }

    clone() {
      const c = super.clone();
      c.iacCode = { ...this.iacCode };
      c.follow = this.follow;
      c.reattachAttempts = this.reattachAttempts;
      c.reattachDelayMs = this.reattachDelayMs;
      return c;
    }

    /** A gateway route, relative to the agent's URL (the gateway's root). */
    route(path) {
      return new URL(path, this.url).toString();
    }

    requestInit(input) {
      const iacCode = { schemaVersion: 1, ...this.iacCode, ...(input.forwardedProps?.iacCode ?? {}) };
      return super.requestInit({
        ...input,
        tools: [],
        forwardedProps: { ...(input.forwardedProps ?? {}), iacCode },
      });
    }

    run(input) {
      const init = this.requestInit(outgoing(input));
      const events = this.route(
        `threads/${encodeURIComponent(input.threadId)}/runs/${encodeURIComponent(input.runId)}/events`,
      );
      return this.stream(this.url, init, events);
    }

    // connectAgent() on a thread that waits for an answer. @ag-ui/client (0.0.59 and 1.0.0: its
    // AbstractAgent.onInitialize) refuses to start, for connectAgent() as for runAgent(), while
    // any of the agent's `pendingInterrupts` is not answered by the input's `resume`, and a
    // connect answers nothing: after a connect (or a run) that ended at an interrupt, the next
    // connect() threw "Thread has N pending interrupt(s) not addressed by resume". The gateway's
    // connect says itself what the thread waits for (its snapshot run ends in RUN_FINISHED with
    // the pending interrupts, or `success`), which the client applies; so the agent's list is set
    // aside while it connects, and put back if the connect told nothing (it failed first).
    async connectAgent(parameters, subscriber) {
      const known = this.pendingInterrupts;
      if (!Array.isArray(known) || known.length === 0) return super.connectAgent(parameters, subscriber);
      const cleared = [];
      this.pendingInterrupts = cleared;
      try {
        return await super.connectAgent(parameters, subscriber);
      } finally {
        if (this.pendingInterrupts === cleared) this.pendingInterrupts = known;
      }
    }

    connect(input) {
      const q = new URLSearchParams();
      if (isV1) q.set("protocolVersion", "1.0");
      if (this.follow) q.set("follow", "true");
      const query = q.toString();
      const url = this.route(
        `threads/${encodeURIComponent(input.threadId)}/connect${query ? `?${query}` : ""}`,
      );
      const init = {
        method: "GET",
        headers: { ...this.headers, Accept: "text/event-stream" },
        signal: this.abortController?.signal,
      };
      return this.stream(url, init, url);
    }

    async getCapabilities() {
      const doFetch = this.fetch ?? fetch;
      const res = await doFetch(this.route("capabilities"), {
        headers: { ...this.headers, Accept: "application/json" },
      });
      if (!res.ok) throw await httpError(res);
      return res.json();
    }

    /** The events of `url` (asked with `init`), re-attached at `again` after a break. */
    stream(url, init, again) {
      return new Observable((subscriber) => {
        let closed = false;
        const doFetch = this.fetch ?? fetch;
        const go = async () => {
          let lastId = null;
          let open = 0;
          let attempt = 0;
          let request = { url, init };
          for (;;) {
            let broken = null;
            try {
              const res = await doFetch(request.url, request.init);
              // Re-attached to a run that ended after everything was seen.
              if (res.status === 204) return subscriber.complete();
              if (!res.ok) throw await httpError(res);
              for await (const { id, data } of sseEvents(res.body)) {
                if (closed) return;
                if (id !== undefined && id !== "") lastId = id;
                const event = JSON.parse(data);
                if (event.type === "RUN_STARTED") open += 1;
                if (TERMINAL.has(event.type)) open = Math.max(0, open - 1);
                subscriber.next(event);
              }
            } catch (e) {
              if (e?.status !== undefined || init.signal?.aborted || e instanceof SyntaxError) throw e;
              broken = e;
            }
            if (closed) return;
            if (open === 0 && !broken) return subscriber.complete();
            if (lastId === null || attempt >= this.reattachAttempts) {
              throw broken ?? new Error("the stream ended before its run did");
            }
            attempt += 1;
            await sleep(this.reattachDelayMs * attempt);
            const { "Content-Type": _, "content-type": __, ...headers } = init.headers ?? {};
            request = {
              url: again,
              init: {
                method: "GET",
                headers: { ...headers, Accept: "text/event-stream", "Last-Event-ID": lastId },
                signal: init.signal,
              },
            };
          }
        };
        go().catch((e) => {
          if (!closed) subscriber.error(e);
        });
        return () => {
          closed = true;
        };
      });
    }
  };
}
