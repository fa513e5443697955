/** @ferryman/client: Ferryman's API from TypeScript, in browsers and Node 20+. */

export * from "./client.js";
export * from "./errors.js";
export { StreamEvent } from "./events.js";
export type { CaughtUp, Envelope, MessageDelta, OwnerEvent, ResyncRequired, SessionEvent } from "./events.js";
export * from "./fold.js";
export * from "./live.js";
export { Backoff, type MalformedFrame } from "./stream.js";
export { SseParser, type SseFrame } from "./sse.js";
export type { components, operations, paths } from "./openapi.js";
