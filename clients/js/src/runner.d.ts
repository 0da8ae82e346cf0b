import type { AbstractAgent, BaseEvent, RunAgentInput } from "@ag-ui/client";
import type { Observable } from "rxjs";

export interface IacCodeAgentRunnerOptions {
  /** The gateway's root URL. */
  url: string;
  /** Sent with every request (the service token, say). */
  headers?: Record<string, string>;
  fetch?: typeof fetch;
  /** `"1.0"` for 1.0 clients behind the runtime; none: the protocol before 1.0. */
  protocolVersion?: string;
  /** Headers of the browser's connect request passed on to the gateway (default: authorization). */
  forwardHeaders?: string[];
}

/** A CopilotKit `AgentRunner` (structurally: `run`, `connect`, `isRunning`, `stop`) that keeps no
 * thread state: connect, isRunning and stop ask the gateway. */
export declare class IacCodeAgentRunner {
  constructor(options: IacCodeAgentRunnerOptions);
  run(request: { threadId: string; agent: AbstractAgent; input: RunAgentInput }): Observable<BaseEvent>;
  connect(request: { threadId: string; headers?: Record<string, string> }): Observable<BaseEvent>;
  isRunning(request: { threadId: string }): Promise<boolean>;
  stop(request: { threadId: string }): Promise<boolean | undefined>;
}
