/** `StreamEvent`: one frame of a stream, as the API sent it (the Python SDK's `StreamEvent`). */

import type { components } from "./openapi.js";

type Schemas = components["schemas"];
export type SessionEvent = Schemas["SessionEvent"];
export type OwnerEvent = Schemas["OwnerEvent"];
export type MessageDelta = Schemas["MessageDelta"];
export type CaughtUp = Schemas["CaughtUp"];
export type ResyncRequired = Schemas["ResyncRequired"];
export type Envelope = Record<string, unknown>;

/**
 * One frame of a stream. Durable events have an `id` (the session's seq, or the owner
 * cursor); a token delta (`message_delta`) has `<seq>.<chunk>`, a place to resume from rather
 * than an event; control frames (`caught_up`, `resync_required`) have none and never move a
 * cursor. `data` is the event's fields; `envelope` the whole JSON of the frame.
 */
export class StreamEvent {
  readonly type: string;
  readonly id: string | null;
  readonly data: Record<string, unknown>;
  readonly envelope: Envelope;

  constructor(type: string, id: string | null, envelope: Envelope) {
    this.type = type;
    this.id = id;
    // Control frames are their payload; events wrap theirs in the envelope's `data`.
    const data = "type" in envelope ? envelope.data : envelope;
    this.data = isRecord(data) ? data : {};
    this.envelope = envelope;
  }

  get durable(): boolean {
    return this.id !== null && this.chunk === null;
  }

  /** A token delta's number among those that follow its `afterSeq` (1, 2, 3...). */
  get chunk(): number | null {
    const chunk = this.envelope.chunk;
    return Number.isInteger(chunk) && this.type === "message_delta" ? (chunk as number) : null;
  }

  get seq(): number | null {
    const seq = this.envelope.seq;
    return Number.isInteger(seq) ? (seq as number) : null;
  }

  get sessionId(): string | null {
    const id = this.envelope.sessionId;
    return id === undefined || id === null ? null : String(id);
  }

  /** The envelope typed as the OpenAPI document has it (durable and ephemeral frames). */
  event(): SessionEvent | OwnerEvent | MessageDelta {
    return { id: this.id ?? "", ...this.envelope } as unknown as SessionEvent | OwnerEvent | MessageDelta;
  }
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}
