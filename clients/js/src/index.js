// IacCodeAgent for the @ag-ui/client installed next to this package (1.0.x or 0.0.59).
import * as agui from "@ag-ui/client";
import { makeIacCodeAgent } from "./agent.js";

export { makeIacCodeAgent, sseEvents } from "./agent.js";
export { IacCodeAgentRunner } from "./runner.js";
export const IacCodeAgent = makeIacCodeAgent(agui);
