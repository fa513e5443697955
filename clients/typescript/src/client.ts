/**
 * `Ferryman`: every REST operation of the API under /api, typed from docs/openapi.json
 * (src/openapi.ts), and both streams. The same calls as the Python SDK's `AsyncFerryman`,
 * named in camelCase.
 */

import { FerrymanConnectionError, apiError, connectionReason } from "./errors.js";
import type { StreamEvent } from "./events.js";
import type { components } from "./openapi.js";
import { Backoff, streamEvents, type MalformedFrame, type StreamTransport } from "./stream.js";

type Schemas = components["schemas"];
export type Session = Schemas["Session"];
export type SessionList = Schemas["SessionList"];
/** A session as a list shows it: `prompt` and `instructions` cut to their first 200 characters,
 * `truncated` naming those cut (getSession has them whole). */
export type SessionSummary = Schemas["SessionSummary"];
export type SessionStatus = Schemas["Status"];
export type CreateSession = Schemas["CreateSession"];
export type CancelAccepted = Schemas["CancelAccepted"];
export type MessageAccepted = Schemas["MessageAccepted"];
export type ApprovalAccepted = Schemas["ApprovalAccepted"];
export type ToolResultAccepted = Schemas["ToolResultAccepted"];
export type Transcript = Schemas["Transcript"];
export type ToolList = Schemas["ToolList"];
export type ToolInfo = Schemas["ToolInfo"];
export type Assistant = Schemas["Assistant"];
export type AssistantList = Schemas["AssistantList"];
export type AssistantVersions = Schemas["AssistantVersions"];
export type CreateAssistant = Schemas["CreateAssistant"];
export type UpdateAssistant = Schemas["UpdateAssistant"];
export type TranscriptEvent = Transcript["events"][number];
export type ForkSession = Schemas["ForkSession"];
export type ForkedFrom = Schemas["ForkedFrom"];
export type CompactionAccepted = Schemas["CompactionAccepted"];

export const DEFAULT_URL = "http://127.0.0.1:8000";
export const OWNER_EVENTS = "/api/agent/owner-events";
/** The most a list or transcript page may hold: iterators take pages this big. */
export const MAX_LIST_LIMIT = 200;
export const MAX_TRANSCRIPT_LIMIT = 1000;

export interface FerrymanOptions {
  /** Default: $FERRYMAN_URL under Node, else http://127.0.0.1:8000. */
  baseUrl?: string;
  /** Sent as `Authorization: Bearer`; default: $FERRYMAN_API_KEY under Node; none for local mode. */
  apiKey?: string | null;
  /** Per request (ms), streams excepted. */
  timeoutMs?: number;
  reconnectDelayMs?: number;
  maxReconnectDelayMs?: number;
  /** A stream silent this long (ms) is taken as dead (the server pings every 15 s). */
  streamIdleTimeoutMs?: number | null;
  /** Another fetch (a test's, a proxy's); default: the global one. */
  fetch?: typeof fetch;
}

export interface RequestOptions {
  signal?: AbortSignal;
}

export interface StreamOptions {
  signal?: AbortSignal;
  onConnection?: (connected: boolean) => void;
  onMalformed?: (malformed: MalformedFrame) => void;
}

type Query = Record<string, string | number | boolean | string[] | null | undefined>;

interface Call {
  method: string;
  path: string;
  query?: Query;
  body?: unknown;
  headers?: Record<string, string>;
  signal?: AbortSignal | undefined;
}

function env(name: string): string | undefined {
  const process = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return process?.env?.[name] || undefined;
}

/** `value` as one path segment, whatever it holds (a `/` or `..` must not move the path). */
export function segment(value: string): string {
  const encoded = encodeURIComponent(value);
  return encoded === "." || encoded === ".." ? encoded.replaceAll(".", "%2E") : encoded;
}

const sessionPath = (id: string): string => `/api/agent/${segment(id)}`;
const assistantPath = (id: string): string => `/api/assistants/${segment(id)}`;

export class Ferryman implements StreamTransport {
  readonly baseUrl: string;
  readonly apiKey: string | null;
  readonly timeoutMs: number;
  readonly reconnectDelayMs: number;
  readonly maxReconnectDelayMs: number;
  readonly streamIdleTimeoutMs: number | null;
  private readonly fetcher: typeof fetch;

  constructor(options: FerrymanOptions = {}) {
    this.baseUrl = (options.baseUrl ?? env("FERRYMAN_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.apiKey = (options.apiKey === undefined ? env("FERRYMAN_API_KEY") : options.apiKey) || null;
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.reconnectDelayMs = options.reconnectDelayMs ?? 500;
    this.maxReconnectDelayMs = options.maxReconnectDelayMs ?? 10_000;
    this.streamIdleTimeoutMs = options.streamIdleTimeoutMs === undefined ? 60_000 : options.streamIdleTimeoutMs;
    this.fetcher = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }

  // --- sessions ---------------------------------------------------------------------------

  /** POST /api/agent. With `idempotencyKey`, a repeat with the same body answers the same session. */
  createSession(body: CreateSession, options: RequestOptions & { idempotencyKey?: string } = {}): Promise<Session> {
    const headers: Record<string, string> = options.idempotencyKey ? { "Idempotency-Key": options.idempotencyKey } : {};
    return this.json({ method: "POST", path: "/api/agent", body, headers, signal: options.signal });
  }

  /** GET /api/agent: newest first; `cursor` is where the owner stream goes on from. */
  listSessions(
    params: { status?: SessionStatus | SessionStatus[]; limit?: number; pageToken?: string | null; q?: string } = {},
    options: RequestOptions = {},
  ): Promise<SessionList> {
    const status = params.status === undefined ? undefined : ([] as string[]).concat(params.status);
    const query = { status, limit: params.limit ?? 50, pageToken: params.pageToken, q: params.q };
    return this.json({ method: "GET", path: "/api/agent", query, signal: options.signal });
  }

  /** Every session (as its summary), page after page. */
  async *iterSessions(params: { status?: SessionStatus | SessionStatus[]; q?: string } = {}, options: RequestOptions = {}): AsyncGenerator<SessionSummary> {
    let pageToken: string | null = null;
    do {
      const page: SessionList = await this.listSessions({ ...params, limit: MAX_LIST_LIMIT, pageToken }, options);
      yield* page.sessions;
      pageToken = page.nextPageToken ?? null;
    } while (pageToken !== null);
  }

  getSession(sessionId: string, options: RequestOptions = {}): Promise<Session> {
    return this.json({ method: "GET", path: sessionPath(sessionId), signal: options.signal });
  }

  renameSession(sessionId: string, title: string, options: RequestOptions = {}): Promise<Session> {
    return this.json({ method: "PATCH", path: sessionPath(sessionId), body: { title }, signal: options.signal });
  }

  /** Soft delete; a session that is not terminal is cancelled first. */
  async deleteSession(sessionId: string, options: RequestOptions = {}): Promise<void> {
    await this.send({ method: "DELETE", path: sessionPath(sessionId), signal: options.signal });
  }

  /** 202 CancelAccepted; with `wait`, the Session once terminal. 409
   * SESSION_ALREADY_TERMINAL is a ConflictError. */
  async cancelSession(sessionId: string, options: RequestOptions & { wait?: boolean } = {}): Promise<Session | CancelAccepted> {
    const query = { wait: options.wait ? "true" : "false" };
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/cancel`, query, signal: options.signal });
  }

  /** POST /api/agent/{id}/messages (operation `postMessage`). */
  sendMessage(sessionId: string, text: string, options: RequestOptions = {}): Promise<MessageAccepted> {
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/messages`, body: { text }, signal: options.signal });
  }

  /** Approve or deny a call waiting for approval (operation `decideToolApproval`). */
  decideToolCall(sessionId: string, toolCallId: string, approved: boolean, reason?: string, options: RequestOptions = {}): Promise<ApprovalAccepted> {
    const body = reason === undefined ? { approved } : { approved, reason };
    const path = `${sessionPath(sessionId)}/tool-calls/${segment(toolCallId)}/approval`;
    return this.json({ method: "POST", path, body, signal: options.signal });
  }

  /** The result of a client tool's call the session waits for (operation `postToolResult`). */
  postToolResult(sessionId: string, toolCallId: string, content: string, isError = false, options: RequestOptions = {}): Promise<ToolResultAccepted> {
    const path = `${sessionPath(sessionId)}/tool-calls/${segment(toolCallId)}/result`;
    return this.json({ method: "POST", path, body: { content, isError }, signal: options.signal });
  }

  /** POST /api/agent/{id}/fork: 201 a new session whose history is this one's log through
   * `atSeq`; with `message`, the user message at `atSeq` replaced (edit and regenerate). */
  forkSession(sessionId: string, body: ForkSession, options: RequestOptions = {}): Promise<Session> {
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/fork`, body, signal: options.signal });
  }

  /** POST /api/agent/{id}/compact: 202, a compaction at the next turn (a waiting or finished
   * session is queued for it). 409 SESSION_NOT_COMPACTABLE is a ConflictError. */
  compactSession(sessionId: string, options: RequestOptions = {}): Promise<CompactionAccepted> {
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/compact`, signal: options.signal });
  }

  /** GET /api/agent/{id}/transcript: events after seq `after`. */
  transcript(sessionId: string, params: { after?: number; limit?: number } = {}, options: RequestOptions = {}): Promise<Transcript> {
    const query = { after: params.after ?? 0, limit: params.limit ?? 200 };
    return this.json({ method: "GET", path: `${sessionPath(sessionId)}/transcript`, query, signal: options.signal });
  }

  /** Every event of the transcript after `after`, page after page. */
  async *iterTranscript(sessionId: string, params: { after?: number } = {}, options: RequestOptions = {}): AsyncGenerator<TranscriptEvent> {
    let after: number | null = params.after ?? 0;
    while (after !== null) {
      const page: Transcript = await this.transcript(sessionId, { after, limit: MAX_TRANSCRIPT_LIMIT }, options);
      yield* page.events;
      after = page.nextAfter ?? null;
    }
  }

  listTools(options: RequestOptions = {}): Promise<ToolList> {
    return this.json({ method: "GET", path: "/api/tools", signal: options.signal });
  }

  // --- assistants -------------------------------------------------------------------------

  createAssistant(body: CreateAssistant, options: RequestOptions = {}): Promise<Assistant> {
    return this.json({ method: "POST", path: "/api/assistants", body, signal: options.signal });
  }

  listAssistants(
    params: { name?: string; metadata?: Record<string, unknown>; limit?: number; pageToken?: string | null } = {},
    options: RequestOptions = {},
  ): Promise<AssistantList> {
    const metadata = params.metadata === undefined ? undefined : JSON.stringify(params.metadata);
    const query = { name: params.name, metadata, limit: params.limit ?? 50, pageToken: params.pageToken };
    return this.json({ method: "GET", path: "/api/assistants", query, signal: options.signal });
  }

  getAssistant(assistantId: string, options: RequestOptions = {}): Promise<Assistant> {
    return this.json({ method: "GET", path: assistantPath(assistantId), signal: options.signal });
  }

  /** A new version with `changes` (by wire name; null clears a field). */
  updateAssistant(assistantId: string, changes: UpdateAssistant, options: RequestOptions = {}): Promise<Assistant> {
    return this.json({ method: "PATCH", path: assistantPath(assistantId), body: changes, signal: options.signal });
  }

  assistantVersions(assistantId: string, params: { limit?: number; pageToken?: string | null } = {}, options: RequestOptions = {}): Promise<AssistantVersions> {
    const query = { limit: params.limit ?? 50, pageToken: params.pageToken };
    return this.json({ method: "GET", path: `${assistantPath(assistantId)}/versions`, query, signal: options.signal });
  }

  async deleteAssistant(assistantId: string, options: RequestOptions = {}): Promise<void> {
    await this.send({ method: "DELETE", path: assistantPath(assistantId), signal: options.signal });
  }

  // --- streams ----------------------------------------------------------------------------

  /**
   * The session's log after seq `after` (none: from seq 1; a token delta's id `<seq>.<chunk>`:
   * after that chunk of the turn streaming then), then live, across reconnects. Ends when a
   * `follow: false` stream has caught up, when the session is deleted, or after a
   * `resync_required` (the cursor is ahead of the log), or when `signal` aborts.
   */
  sessionEvents(sessionId: string, params: { after?: number | string | null; follow?: boolean } & StreamOptions = {}): AsyncGenerator<StreamEvent, void, undefined> {
    return streamEvents(this, {
      path: `${sessionPath(sessionId)}/events`,
      cursor: params.after === undefined || params.after === null ? null : String(params.after),
      onResync: "end",
      follow: params.follow ?? true,
      endsOn404: true,
      onConnection: params.onConnection,
      onMalformed: params.onMalformed,
      signal: params.signal,
    });
  }

  /**
   * The owner's lifecycle feed after `cursor` (a list's `cursor`; none: live from now),
   * until `signal` aborts. `onResync: "snapshot"` (the default) yields `resync_required`, then
   * goes on from a fresh list snapshot's cursor: the caller should reload its own state then.
   */
  ownerEvents(params: { cursor?: string | null; onResync?: "end" | "snapshot" } & StreamOptions = {}): AsyncGenerator<StreamEvent, void, undefined> {
    return streamEvents(this, {
      path: OWNER_EVENTS,
      cursor: params.cursor ?? null,
      onResync: params.onResync ?? "snapshot",
      follow: true,
      endsOn404: false,
      onConnection: params.onConnection,
      onMalformed: params.onMalformed,
      signal: params.signal,
    });
  }

  // --- what streams need (StreamTransport) ------------------------------------------------

  backoff(): Backoff {
    return new Backoff(this.reconnectDelayMs, this.maxReconnectDelayMs);
  }

  open(path: string, headers: Record<string, string>, query: Record<string, string>, signal: AbortSignal): Promise<Response> {
    return this.fetchOrThrow(this.url(path, query), { method: "GET", headers: this.headers(headers), signal });
  }

  async listCursor(signal: AbortSignal): Promise<string> {
    return (await this.listSessions({ limit: 1 }, { signal })).cursor;
  }

  // --- transport --------------------------------------------------------------------------

  private async json<T>(call: Call): Promise<T> {
    const response = await this.send(call);
    const text = await response.text();
    return (text ? JSON.parse(text) : null) as T;
  }

  private async send(call: Call): Promise<Response> {
    const headers = this.headers(call.headers ?? {});
    if (call.body !== undefined) headers["Content-Type"] = "application/json";
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const signal = call.signal ? AbortSignal.any([call.signal, timeout]) : timeout;
    const init: RequestInit = { method: call.method, headers, signal };
    if (call.body !== undefined) init.body = JSON.stringify(call.body);
    const response = await this.fetchOrThrow(this.url(call.path, call.query ?? {}), init);
    if (response.status >= 400) throw await apiError(response);
    return response;
  }

  private async fetchOrThrow(url: string, init: RequestInit): Promise<Response> {
    try {
      return await this.fetcher(url, init);
    } catch (error) {
      if (init.signal?.aborted && (init.signal.reason as Error | undefined)?.name !== "TimeoutError") throw error;
      const reason = (init.signal?.reason as Error | undefined)?.name === "TimeoutError" ? "timed out" : connectionReason(error);
      throw new FerrymanConnectionError(this.baseUrl, reason, { cause: error });
    }
  }

  private headers(extra: Record<string, string>): Record<string, string> {
    const headers: Record<string, string> = { ...extra };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    return headers;
  }

  private url(path: string, query: Query): string {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value === undefined || value === null) continue;
      for (const item of Array.isArray(value) ? value : [value]) params.append(name, String(item));
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }
}
