/**
 * A session's conversation folded from its events, free of I/O (the Python SDK's
 * `SessionFold`): feed `apply` the frames of `sessionEvents` (or a transcript's events) in
 * seq order.
 *
 * A durable event is applied once: one whose seq the fold has passed is ignored, so a stream
 * that replays after a reconnect, or a transcript read over a stream, changes nothing.
 * Streamed text (`message_delta`, which has no seq) is a draft until its turn ends: the final
 * `assistant_message` replaces it, and a retried (`model_retry`) or interrupted turn drops it.
 * A numbered delta (`chunk`) is applied once too, so a reconnect from an event mid-turn, which
 * replays the turn's stored chunks, repeats no text; and a delta of a turn that has ended or
 * was dropped since (its `afterSeq` is older) is stale, so it starts no new draft.
 */

import { StreamEvent, isRecord, type Envelope } from "./events.js";

export type Role = "user" | "assistant";
export type ToolCallStatus =
  | "pending" // the model asked for it; not started
  | "awaiting_approval"
  | "approved" // approved; not started yet
  | "running"
  | "succeeded"
  | "failed"
  | "denied";

export const INTERRUPTED = "worker interrupted";

export interface Message {
  readonly role: Role;
  readonly text: string;
  /** null while the text still streams (the draft of a turn). */
  readonly seq: number | null;
  readonly toolCallIds: readonly string[];
  /** assistant: stop, tool_use, length, error, aborted */
  readonly stopReason: string | null;
  /** user: queued or steer */
  readonly delivery: string | null;
}

export interface ToolCall {
  readonly id: string;
  readonly name: string;
  readonly arguments: Record<string, unknown>;
  readonly status: ToolCallStatus;
  /** The tool's content, on success or error. */
  readonly result: string | null;
  readonly error: string | null;
  readonly timedOut: boolean;
  readonly interrupted: boolean;
  /** A delegate call's child session (docs/delegation.md): the call runs while it does. */
  readonly childSessionId: string | null;
  /** The child's end as its `delegate_result` says, before the parent's `tool_result`. */
  readonly delegated: DelegateResult | null;
}

/** A `delegate_result`: how a delegate call's child session ended. */
export interface DelegateResult {
  /** succeeded, failed or cancelled */
  readonly status: string;
  /** When succeeded: the child's final answer. */
  readonly answer: string | null;
  readonly error: Record<string, unknown> | null;
}

/** A `session_compacted`: from `seq` on, the model sees `summary` instead of the messages
 * through `throughSeq` (the fold keeps them all, as the log does). */
export interface Compaction {
  readonly seq: number;
  readonly throughSeq: number;
  readonly summary: string;
  /** The request's estimated tokens before and after. */
  readonly tokensBefore: number;
  readonly tokensAfter: number;
  /** The model that wrote the summary. */
  readonly model: string;
}

/** What a fold shows, as one plain value. */
export interface Conversation {
  readonly messages: readonly Message[];
  readonly toolCalls: readonly ToolCall[];
  readonly status: string | null;
  readonly error: Record<string, unknown> | null;
  readonly question: Record<string, unknown> | null;
  readonly lastSeq: number;
  readonly draft: string | null;
  readonly compactions: readonly Compaction[];
}

/** A frame of a stream, or an event of a transcript page (the same envelope). */
export type FoldInput = StreamEvent | Envelope;

type Data = Record<string, unknown>;

function message(role: Role, text: string, seq: number | null, extra: Partial<Message> = {}): Message {
  return { role, text, seq, toolCallIds: [], stopReason: null, delivery: null, ...extra };
}

function toolCall(id: string, name = "", args: Record<string, unknown> = {}): ToolCall {
  return {
    id,
    name,
    arguments: args,
    status: "pending",
    result: null,
    error: null,
    timedOut: false,
    interrupted: false,
    childSessionId: null,
    delegated: null,
  };
}

/**
 * The conversation picture of one session. `status` is what the log says (the session stream
 * carries no `session_status`): queued after a queued message, running from a start or
 * resume, the status of `session_end` after one.
 */
export class SessionFold {
  status: string | null;
  error: Record<string, unknown> | null = null;
  /** A pending `user_question`. */
  question: Record<string, unknown> | null = null;
  lastSeq = 0;
  draft: string | null = null;
  private chunk: [number, number] = [0, 0]; // (afterSeq, chunk) of the last delta applied
  private turnEnded = 0; // seq of the last event that ended or dropped a turn
  private readonly list: Message[] = [];
  private readonly calls = new Map<string, ToolCall>();
  private readonly summaries: Compaction[] = [];

  constructor(options: { status?: string | null } = {}) {
    this.status = options.status ?? null;
  }

  /** Where a stream of this session goes on from (`sessionEvents`' `after`): the last event's
   * seq, and while a turn streams, its chunks held too (`<seq>.<chunk>`, a delta's id), so a
   * reconnect sends only the chunks missed. */
  get cursor(): number | string {
    return this.draft !== null && this.chunk[1] > 0 ? `${this.lastSeq}.${this.chunk[1]}` : this.lastSeq;
  }

  /** The messages, and the turn streaming now (if any) last. */
  get messages(): Message[] {
    return this.draft === null ? [...this.list] : [...this.list, message("assistant", this.draft, null)];
  }

  /** Each `session_compacted`, oldest first: the latest is what the model sees now. */
  get compactions(): Compaction[] {
    return [...this.summaries];
  }

  /** By id, in the order the model asked for them. */
  get toolCalls(): Map<string, ToolCall> {
    return new Map(this.calls);
  }

  snapshot(): Conversation {
    return {
      messages: this.messages,
      toolCalls: [...this.calls.values()],
      status: this.status,
      error: this.error,
      question: this.question,
      lastSeq: this.lastSeq,
      draft: this.draft,
      compactions: this.compactions,
    };
  }

  /** Fold in one frame; whether the picture changed. Control frames and durable events
   * already applied change nothing. */
  apply(event: FoldInput): boolean {
    const { type, seq, data, envelope } = parts(event);
    if (seq === null) {
      if (type !== "message_delta") return false;
      const afterSeq = envelope.afterSeq;
      if (Number.isInteger(afterSeq) && (afterSeq as number) < this.turnEnded) return false; // its turn is over
      const chunk = chunkOf(envelope);
      if (chunk !== null) {
        if (before(chunk, this.chunk)) return false; // replayed: a reconnect from an event resends the turn's
        this.chunk = chunk;
      }
      this.draft = (this.draft ?? "") + str(data.text);
      return true;
    }
    if (seq <= this.lastSeq) return false;
    this.lastSeq = seq;
    HANDLERS[type]?.call(this, data);
    return true;
  }

  applyAll(events: Iterable<FoldInput>): boolean {
    let changed = false;
    for (const event of events) changed = this.apply(event) || changed;
    return changed;
  }

  /** The draft goes (replaced, retried or cut off), and deltas after an earlier event with it. */
  private endTurn(): void {
    this.draft = null;
    this.turnEnded = this.lastSeq;
  }

  // --- one method per durable event type -------------------------------------------------

  private userMessage(data: Data): void {
    const delivery = data.delivery === undefined ? "queued" : str(data.delivery);
    this.list.push(message("user", str(data.text), this.lastSeq, { delivery }));
    this.question = null;
    if (delivery === "queued") this.status = "queued";
  }

  private started(): void {
    this.endTurn();
    this.status = "running";
    this.error = null;
  }

  private resumed(data: Data): void {
    this.started();
    // Each call the dead worker left without a result was answered "worker interrupted".
    const repaired = data.repairedToolCalls ?? data.repairedToolCallIds;
    for (const id of Array.isArray(repaired) ? repaired.map(String) : []) {
      const call = this.calls.get(id) ?? toolCall(id);
      this.calls.set(id, { ...call, status: "failed", error: INTERRUPTED, interrupted: true });
    }
  }

  private assistantMessage(data: Data): void {
    this.endTurn();
    const calls = (Array.isArray(data.toolCalls) ? data.toolCalls : []).filter(isRecord);
    for (const call of calls) {
      const id = str(call.id);
      if (!this.calls.has(id)) this.calls.set(id, toolCall(id, str(call.name), record(call.arguments)));
    }
    const text = data.text ? str(data.text) : "";
    if (text || calls.length > 0) {
      const stopReason = data.stopReason === undefined || data.stopReason === null ? null : str(data.stopReason);
      this.list.push(message("assistant", text, this.lastSeq, { toolCallIds: calls.map((c) => str(c.id)), stopReason }));
    }
  }

  private call(data: Data): ToolCall {
    const id = str(data.toolCallId);
    return this.calls.get(id) ?? toolCall(id, str(data.name), record(data.arguments));
  }

  private setCall(call: ToolCall, changes: Partial<ToolCall>): void {
    this.calls.set(call.id, { ...call, ...changes });
  }

  private toolCallStart(data: Data): void {
    this.setCall(this.call(data), { status: "running" });
  }

  private delegateCall(data: Data): void {
    this.setCall(this.call(data), { status: "running", childSessionId: str(data.childSessionId) || null });
  }

  /** The child ended: the call still runs until the parent's next run answers it. */
  private delegateResult(data: Data): void {
    const answer = data.answer === undefined || data.answer === null ? null : str(data.answer);
    const error = isRecord(data.error) ? { ...data.error } : null;
    const childSessionId = str(data.childSessionId) || null;
    this.setCall(this.call(data), { childSessionId, delegated: { status: str(data.status), answer, error } });
  }

  private toolResult(data: Data): void {
    const content = str(data.content);
    const status: ToolCallStatus = data.denied ? "denied" : data.isError ? "failed" : "succeeded";
    this.setCall(this.call(data), {
      status,
      result: content,
      error: status === "succeeded" ? null : content,
      timedOut: Boolean(data.timedOut),
      interrupted: Boolean(data.interrupted),
    });
  }

  private approvalRequested(data: Data): void {
    this.setCall(this.call(data), { status: "awaiting_approval" });
  }

  private approvalDecided(data: Data): void {
    const call = this.call(data);
    if (data.approved) this.setCall(call, { status: "approved" });
    else this.setCall(call, { status: "denied", error: data.reason ? str(data.reason) : "denied" });
    if (this.status === "waiting") this.status = "queued"; // a decision re-queues a waiting session
  }

  private userQuestion(data: Data): void {
    this.question = { ...data };
  }

  private turnDropped(): void {
    this.endTurn();
  }

  private compacted(data: Data): void {
    this.summaries.push({
      seq: this.lastSeq,
      throughSeq: int(data.throughSeq),
      summary: str(data.summary),
      tokensBefore: int(data.tokensBefore),
      tokensAfter: int(data.tokensAfter),
      model: str(data.model),
    });
  }

  private sessionEnd(data: Data): void {
    this.endTurn();
    if (data.status !== undefined) this.status = str(data.status);
    this.error = isRecord(data.error) ? { ...data.error } : null;
  }
}

type Handler = (this: SessionFold, data: Data) => void;
type Methods = Record<string, Handler>;
const methods = SessionFold.prototype as unknown as Methods;
const HANDLERS: Record<string, Handler | undefined> = {
  user_message: methods.userMessage,
  session_start: methods.started,
  session_resumed: methods.resumed,
  assistant_message: methods.assistantMessage,
  tool_call_start: methods.toolCallStart,
  delegate_call: methods.delegateCall,
  delegate_result: methods.delegateResult,
  tool_result: methods.toolResult,
  tool_approval_requested: methods.approvalRequested,
  tool_approval_decided: methods.approvalDecided,
  user_question: methods.userQuestion,
  model_retry: methods.turnDropped,
  session_interrupted: methods.turnDropped,
  session_end: methods.sessionEnd,
  session_compacted: methods.compacted,
};

/** The type, seq (null for ephemeral and control frames), data and envelope of a frame. */
function parts(event: FoldInput): { type: string; seq: number | null; data: Data; envelope: Envelope } {
  if (event instanceof StreamEvent) {
    return { type: event.type, seq: event.durable ? event.seq : null, data: event.data, envelope: event.envelope };
  }
  const seq = Number.isInteger(event.seq) ? (event.seq as number) : null;
  return { type: str(event.type), seq, data: record(event.data), envelope: event };
}

/** (afterSeq, chunk) of a numbered token delta, which orders a session's deltas. */
function chunkOf(envelope: Envelope): [number, number] | null {
  const { afterSeq, chunk } = envelope;
  return Number.isInteger(afterSeq) && Number.isInteger(chunk) ? [afterSeq as number, chunk as number] : null;
}

function before(a: [number, number], b: [number, number]): boolean {
  return a[0] < b[0] || (a[0] === b[0] && a[1] <= b[1]);
}

function str(value: unknown): string {
  return value === undefined || value === null ? "" : String(value);
}

function int(value: unknown): number {
  return Number.isInteger(value) ? (value as number) : 0;
}

function record(value: unknown): Record<string, unknown> {
  return isRecord(value) ? { ...value } : {};
}
