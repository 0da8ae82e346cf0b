// Type-checked (tsc --noEmit) by the tests: the shipped types describe what the package does.
import {
  IacCodeAgent,
  IacCodeAgentRunner,
  makeIacCodeAgent,
  type IacCodeCapabilities,
} from "../src/index.js";
import * as agui from "@ag-ui/client";

const agent = new IacCodeAgent({
  url: "http://127.0.0.1:8000/",
  threadId: "t1",
  headers: { authorization: "Bearer x" },
  iacCode: { cwd: "/workspace/t1", rosInvocationId: "inv-1", runMode: "pipeline" },
  follow: true,
  reattachAttempts: 3,
});
const caps: Promise<IacCodeCapabilities> = agent.getCapabilities();
const route: string = agent.route("threads");
const connected: Promise<agui.RunAgentResult> = agent.connectAgent({}, { onRunFinishedEvent: () => {} });
void connected;
const Made: typeof IacCodeAgent = makeIacCodeAgent(agui);
const base: agui.HttpAgent = new Made({ url: "http://127.0.0.1:8000/" });
const runner = new IacCodeAgentRunner({ url: "http://127.0.0.1:8000/", protocolVersion: "1.0" });
const running: Promise<boolean> = runner.isRunning({ threadId: "t1" });
void running;
void caps;
void route;
void base;
// @ts-expect-error: iacCode values are typed where the gateway reads them.
new IacCodeAgent({ url: "x", iacCode: { llmHeaders: "not a record" } });
