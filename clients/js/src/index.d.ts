export {
  IacCodeAgent,
  makeIacCodeAgent,
  sseEvents,
  type IacCodeAgentConfig,
  type IacCodeCapabilities,
  type IacCodeProps,
} from "./agent.js";
export { IacCodeAgentRunner, type IacCodeAgentRunnerOptions } from "./runner.js";
