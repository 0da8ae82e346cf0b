export {
  IacCodeAgent,
  makeIacCodeAgent,
  sseEvents,
  type IacCodeAgentConfig,
  type IacCodeCapabilities,
  type IacCodeProps,
} from "./agent.js";
