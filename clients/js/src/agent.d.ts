import type {
  AgentCapabilities,
  AgentSubscriber,
  HttpAgent,
  HttpAgentConfig,
  RunAgentParameters,
  RunAgentResult,
} from "@ag-ui/client";

/** What the gateway reads from `forwardedProps.iacCode` (see the gateway's book, docs/src/guide/front-ends.md). */
export interface IacCodeProps {
  /** The run's workspace: an absolute path within the gateway's allowed roots. */
  cwd?: string;
  rosInvocationId?: string;
  userId?: string;
  model?: string;
  channel?: string;
  runMode?: "default" | "pipeline" | (string & {});
  pipelineName?: string;
  /** Secrets for the kernel: sent, never stored, logged or echoed by the gateway. */
  llmApiKey?: string;
  llmHeaders?: Record<string, string>;
  [key: string]: unknown;
}

export interface IacCodeAgentConfig extends HttpAgentConfig {
  /** The gateway's root URL, e.g. `http://127.0.0.1:8000/`. */
  url: string;
  /** Filled into every run's `forwardedProps.iacCode` (a run's own values win). */
  iacCode?: IacCodeProps;
  /** connect() keeps following the thread's later runs. Default false. */
  follow?: boolean;
  /** Re-attaching a broken stream: how many times (default 5) and the first wait (500 ms). */
  reattachAttempts?: number;
  reattachDelayMs?: number;
}

/** The gateway's `GET /capabilities`: AG-UI's AgentCapabilities, the gateway's own under
 * `custom.iacCode`. */
export type IacCodeCapabilities = AgentCapabilities;

export declare class IacCodeAgent extends HttpAgent {
  constructor(config: IacCodeAgentConfig);
  iacCode: IacCodeProps;
  follow: boolean;
  reattachAttempts: number;
  reattachDelayMs: number;
  /** A gateway route, relative to the agent's URL. */
  route(path: string): string;
  /** HttpAgent's, callable again on a thread that waits for an answer: the agent's
   * `pendingInterrupts` are set to what the gateway's connect reports (kept if it fails first). */
  connectAgent(parameters?: RunAgentParameters, subscriber?: AgentSubscriber): Promise<RunAgentResult>;
  getCapabilities(): Promise<IacCodeCapabilities>;
}

/** The class for a given `@ag-ui/client` module (1.0.x or 0.0.59). */
export declare function makeIacCodeAgent(agui: typeof import("@ag-ui/client")): typeof IacCodeAgent;

/** The events of an SSE body. */
export declare function sseEvents(
  body: ReadableStream<Uint8Array>,
): AsyncGenerator<{ id: string | undefined; data: string }>;
