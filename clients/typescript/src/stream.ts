/**
 * One logical stream over as many connections as it takes (the Python SDK's `Stream`): it
 * keeps the cursor (the last durable id) and sends it as `Last-Event-ID`, decides which
 * failures end it, and waits a jittered backoff before the next connection.
 */

import { FerrymanConnectionError, FerrymanError, apiError, connectionReason } from "./errors.js";
import { StreamEvent, isRecord } from "./events.js";
import { SseParser, type SseFrame } from "./sse.js";

/** Delays doubling from `first` up to `cap` (ms), each jittered to 50-100 % of itself so that
 * clients cut off together do not all come back together. */
export class Backoff {
  readonly first: number;
  readonly cap: number;
  private delay: number;

  constructor(first: number, cap: number) {
    this.first = first;
    this.cap = cap;
    this.delay = first;
  }

  reset(): void {
    this.delay = this.first;
  }

  next(): number {
    const delay = this.delay * (0.5 + Math.random() / 2);
    this.delay = Math.min(this.delay * 2, this.cap);
    return delay;
  }
}

/** A frame whose `data` is not a JSON object: skipped, and told to `onMalformed` if given
 * (without it, the connection is taken as broken and opened again, as the Python SDK does). */
export interface MalformedFrame {
  frame: SseFrame;
  reason: string;
}

export interface StreamSpec {
  path: string;
  cursor: string | null;
  /** "end" stops after yielding `resync_required`; "snapshot" takes the cursor of a fresh
   * list snapshot and goes on from it. */
  onResync: "end" | "snapshot";
  /** false: the stream ends after `caught_up`. */
  follow: boolean;
  /** A session stream ends on a 404 once it has been open (the session was deleted). */
  endsOn404: boolean;
  /** Told true when a connection opens, false when it is lost. */
  onConnection?: ((connected: boolean) => void) | undefined;
  onMalformed?: ((malformed: MalformedFrame) => void) | undefined;
  signal?: AbortSignal | undefined;
}

/** What a stream needs of the client: a connection, and a fresh list cursor. */
export interface StreamTransport {
  readonly baseUrl: string;
  backoff(): Backoff;
  /** The idle limit (ms) of one connection: a stream this silent is dead (pings come every
   * 15 s); null for none. */
  readonly streamIdleTimeoutMs: number | null;
  open(path: string, headers: Record<string, string>, query: Record<string, string>, signal: AbortSignal): Promise<Response>;
  listCursor(signal: AbortSignal): Promise<string>;
}

class Broken extends Error {}

/** The frames of `spec`'s stream, across reconnects, each durable event once. */
export async function* streamEvents(transport: StreamTransport, spec: StreamSpec): AsyncGenerator<StreamEvent, void, undefined> {
  const state = new StreamState(spec, transport.backoff());
  const outer = spec.signal;
  while (!outer?.aborted) {
    const connection = new AbortController();
    const abort = (): void => connection.abort();
    outer?.addEventListener("abort", abort, { once: true });
    try {
      if (state.needsSnapshot) state.snapshot(await transport.listCursor(connection.signal));
      const response = await transport.open(spec.path, state.headers(), state.query(), connection.signal);
      await state.opened(response);
      for await (const event of frames(transport, state, response, connection)) {
        yield event;
        if (state.interrupted) break;
      }
      state.closed();
    } catch (error) {
      if (outer?.aborted) return;
      state.failed(error, transport.baseUrl);
    } finally {
      outer?.removeEventListener("abort", abort);
      connection.abort(); // the body of a connection left early
    }
    if (state.ended) return;
    await sleep(state.delay(), outer);
  }
}

async function* frames(transport: StreamTransport, state: StreamState, response: Response, connection: AbortController): AsyncGenerator<StreamEvent> {
  if (response.body === null) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  const idle = transport.streamIdleTimeoutMs;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = (): void => {
    if (idle === null) return;
    clearTimeout(timer);
    timer = setTimeout(() => connection.abort(new Broken("the stream went silent")), idle);
  };
  try {
    arm();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      arm();
      for (const frame of parser.feed(decoder.decode(value, { stream: true }))) {
        const event = state.receive(frame);
        if (event !== null) yield event;
        if (state.interrupted) return;
      }
    }
  } finally {
    clearTimeout(timer);
    reader.releaseLock();
  }
}

class StreamState {
  cursor: string | null;
  ended = false;
  needsSnapshot = false;
  private openedOnce = false;

  constructor(
    private readonly spec: StreamSpec,
    private readonly backoff: Backoff,
  ) {
    this.cursor = spec.cursor;
  }

  headers(): Record<string, string> {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (this.cursor !== null) headers["Last-Event-ID"] = this.cursor;
    return headers;
  }

  query(): Record<string, string> {
    return this.spec.follow ? {} : { follow: "false" };
  }

  async opened(response: Response): Promise<void> {
    if (response.status >= 400) throw await apiError(response);
    this.openedOnce = true;
    this.backoff.reset();
    this.tell(true);
  }

  receive(frame: SseFrame): StreamEvent | null {
    let envelope: unknown;
    try {
      envelope = JSON.parse(frame.data);
    } catch (error) {
      return this.malformed(frame, `a frame that is not JSON: ${String(error)}`);
    }
    if (!isRecord(envelope)) return this.malformed(frame, "a frame that is not a JSON object");
    const event = new StreamEvent(frame.event, frame.id || null, envelope);
    if (event.id !== null) this.cursor = event.id;
    if (event.type === "resync_required") {
      this.needsSnapshot = this.spec.onResync === "snapshot";
      this.ended = this.spec.onResync === "end";
    }
    if (event.type === "caught_up" && !this.spec.follow) this.ended = true;
    return event;
  }

  private malformed(frame: SseFrame, reason: string): null {
    if (this.spec.onMalformed === undefined) throw new Broken(reason);
    if (frame.id) this.cursor = frame.id; // received: the same bytes again would not help
    this.spec.onMalformed({ frame, reason });
    return null;
  }

  /** Whether to stop reading this connection. */
  get interrupted(): boolean {
    return this.ended || this.needsSnapshot;
  }

  closed(): void {
    if (!this.ended) this.tell(false);
  }

  /** A failure that means "connect again" returns; any other is thrown. */
  failed(error: unknown, baseUrl: string): void {
    this.tell(false);
    if (error instanceof FerrymanError) {
      if (error.status === 404 && this.spec.endsOn404 && this.openedOnce) this.ended = true;
      else if (!error.retryable) throw error;
      return;
    }
    if (error instanceof FerrymanConnectionError || error instanceof Broken) return;
    if (error instanceof TypeError || (error instanceof Error && error.name === "AbortError")) return;
    if (error instanceof Error && /terminated|other side closed|socket/i.test(error.message)) return;
    throw error instanceof Error ? error : new FerrymanConnectionError(baseUrl, connectionReason(error));
  }

  delay(): number {
    return this.needsSnapshot ? 0 : this.backoff.next();
  }

  snapshot(cursor: string): void {
    this.cursor = cursor;
    this.needsSnapshot = false;
  }

  private tell(connected: boolean): void {
    this.spec.onConnection?.(connected);
  }
}

/** Wait `ms`, or less if `signal` aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
