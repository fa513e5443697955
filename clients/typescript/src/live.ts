/**
 * `OwnerSessionClient`: a live, correct picture of one owner's sessions (the Python SDK's
 * `OwnerSessionClient`, clients/python/src/ferryman/live.py).
 *
 * It takes a list snapshot (every page), then follows the owner stream from the snapshot's
 * cursor, reconnecting with `Last-Event-ID` after a jittered backoff. It takes a new snapshot
 * at once on `resync_required`, on an event about a session it does not know, after
 * `malformedLimit` malformed events, and every `reconcileIntervalMs` (jittered) to heal what
 * events cannot say (lease, usage, `lastSeq`). `healthy` turns false after `unhealthyAfterMs`
 * of failed reconnects; `journal` keeps the latest events and what became of each.
 *
 * With a `range` it pictures part of the list instead, as a page that scrolls would: the
 * sessions that match its filters, one page at first and one more per `loadMore()`.
 */

import { MAX_LIST_LIMIT, type CancelAccepted, type Ferryman, type Session, type SessionList, type SessionStatus } from "./client.js";
import { ConflictError, FerrymanConnectionError, FerrymanError, NotFoundError } from "./errors.js";
import { isRecord, type StreamEvent } from "./events.js";
import { sleep } from "./stream.js";

export type Picture = Map<string, Session>;

/** What became of an event: applied, already applied (a replay), about a session deleted
 * since, one that made the picture take a new snapshot, or (with a range) about a session
 * outside it. */
export type JournalOutcome = "applied" | "duplicate" | "gone" | "control" | "resync" | "unknown_session" | "malformed" | "outside";

export interface JournalEntry {
  readonly at: number; // Date.now() when it came
  readonly type: string;
  readonly id: string | null;
  readonly sessionId: string | null;
  readonly outcome: JournalOutcome;
}

/** Part of the list: what `GET /api/agent` answers for these filters, newest first. */
export interface ListRange {
  /** Sessions in any of these statuses (none: every status). */
  status?: SessionStatus[];
  /** Titles that contain this, case-insensitive (the list's `q`). */
  q?: string;
  /** Sessions a page (`loadMore()` takes one more). Default 50. */
  pageSize?: number;
}

export interface OwnerSessionClientOptions {
  /** Picture this part of the list, not every session. */
  range?: ListRange;
  /** A new snapshot this often (ms), jittered by +-10 %. */
  reconcileIntervalMs?: number;
  /** Failed reconnects for this long (ms) turn `healthy` false. */
  unhealthyAfterMs?: number;
  /** Malformed events (not JSON, or an envelope without its fields) before a new snapshot. */
  malformedLimit?: number;
  /** How many events `journal` keeps. */
  journalSize?: number;
  onChange?: (client: OwnerSessionClient) => void;
  onHealthChange?: (healthy: boolean, client: OwnerSessionClient) => void;
}

type Update = (data: Record<string, unknown>) => Partial<Session>;

function status(data: Record<string, unknown>): Partial<Session> {
  const change = { status: data.status, error: data.error ?? null } as Partial<Session>;
  if (Number.isInteger(data.attempt)) change.attempt = data.attempt as number;
  return change;
}

// What an owner event changes, as field values.
const LOCAL_UPDATES: Record<string, Update | undefined> = {
  session_title: (data) => ({ title: String(data.title ?? "") }),
  session_active_stage: (data) => ({ activeStage: (data.stage ?? null) as Session["activeStage"] }),
  session_cancel_requested: () => ({ cancelRequested: true }),
  session_status: status,
};
// After these, fields that no event carries (lease, usage, lastSeq, updatedAt) changed too:
// the session is fetched again, as after an event not above (`session_resumed`, a newer type).
const REFETCH = new Set(["session_status"]);
// Events that may bring a session outside a filtered range into it.
const MAY_MATCH = new Set(["session_status", "session_title"]);

/** Why a follow period ended early: a new snapshot is due. */
class SnapshotDue extends Error {}

/**
 * `sessions` by id, always as the server has them (give or take the latest events);
 * `connected` is false while the stream reconnects. `start()`, then watch `changes()` or pass
 * `onChange`; `close()` when done.
 */
export class OwnerSessionClient {
  readonly client: Ferryman;
  readonly reconcileIntervalMs: number;
  readonly unhealthyAfterMs: number;
  readonly malformedLimit: number;
  readonly journalSize: number;
  readonly range: Required<ListRange> | null;
  onChange: ((client: OwnerSessionClient) => void) | undefined;
  onHealthChange: ((healthy: boolean, client: OwnerSessionClient) => void) | undefined;
  sessions: Picture = new Map();
  connected = false;
  /** False once reconnects have failed for `unhealthyAfterMs`; true again on `caught_up`. */
  healthy = true;
  /** The last owner event applied. */
  lastEventId: string | null = null;
  /** List snapshots taken, the first one included. */
  snapshots = 0;
  /** Malformed events since the last snapshot. */
  malformed = 0;
  readonly journal: JournalEntry[] = [];
  private gone = new Set<string>(); // deleted since the snapshot: their late events are moot
  private waiters: Array<() => void> = [];
  private stop = new AbortController();
  private task: Promise<void> | null = null;
  private failure: unknown = null;
  private unhealthyTimer: ReturnType<typeof setTimeout> | undefined;
  private pagesWanted = 1; // with a range: the pages a snapshot takes
  private nextPageToken: string | null = null;

  constructor(client: Ferryman, options: OwnerSessionClientOptions = {}) {
    this.client = client;
    this.reconcileIntervalMs = options.reconcileIntervalMs ?? 60_000;
    this.unhealthyAfterMs = options.unhealthyAfterMs ?? 45_000;
    this.malformedLimit = options.malformedLimit ?? 5;
    this.journalSize = options.journalSize ?? 200;
    const range = options.range;
    this.range = range === undefined ? null : { status: range.status ?? [], q: (range.q ?? "").trim(), pageSize: range.pageSize ?? 50 };
    this.onChange = options.onChange;
    this.onHealthChange = options.onHealthChange;
  }

  /** Take the first snapshot (its errors are thrown here), then follow in the background. */
  async start(): Promise<this> {
    const cursor = await this.snapshot();
    this.task = this.followForever(cursor).catch(() => undefined);
    return this;
  }

  /** Keep the picture current until `close()` or a fatal error (thrown). */
  async run(): Promise<void> {
    await this.followForever(await this.snapshot());
  }

  /** Stop following. An error that stopped it already is `error` (and `changes()`'s). */
  async close(): Promise<void> {
    this.stop.abort();
    clearTimeout(this.unhealthyTimer);
    await this.task;
    this.task = null;
    this.wake();
  }

  /** Whether the picture holds every session of its range (always, without a range). */
  get complete(): boolean {
    return this.nextPageToken === null;
  }

  /** With a range: the next page into the picture (and every later snapshot); false when
   * there is none. */
  async loadMore(): Promise<boolean> {
    const token = this.nextPageToken;
    if (this.range === null || token === null) return false;
    const snapshots = this.snapshots;
    this.pagesWanted += 1;
    const page = await this.page(token);
    if (snapshots !== this.snapshots) return true; // a snapshot took it in since
    for (const session of page.sessions) if (!this.gone.has(session.id)) this.sessions.set(session.id, session);
    this.nextPageToken = page.nextPageToken ?? null;
    this.notify();
    return true;
  }

  /** What stopped the picture (a revoked key, say), if anything did. */
  get error(): unknown {
    return this.failure;
  }

  /** The picture now, then after each change (changes that come together are yielded once).
   * Throws what stopped the picture; ends after `close()`. */
  async *changes(): AsyncGenerator<Picture, void, undefined> {
    for (;;) {
      const changed = new Promise<void>((resolve) => this.waiters.push(resolve));
      if (this.failure !== null) throw this.failure;
      yield new Map(this.sessions);
      if (this.stop.signal.aborted) return;
      await changed;
    }
  }

  /** The first picture, this one included, for which `predicate` holds. */
  async waitUntil(predicate: (picture: Picture) => boolean, timeoutMs?: number): Promise<Picture> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const changes = this.changes();
    const expired = new Promise<never>((_, reject) => {
      if (timeoutMs !== undefined) timer = setTimeout(() => reject(new Error(`waitUntil: not within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      for (;;) {
        const next = await Promise.race([changes.next(), expired]);
        if (next.done) throw new Error("waitUntil: the picture was closed");
        if (predicate(next.value)) return next.value;
      }
    } finally {
      clearTimeout(timer);
      void changes.return(undefined);
    }
  }

  /**
   * Cancel a session. 409 SESSION_ALREADY_TERMINAL means it ended before the cancel came:
   * not an error here, the session is read again and returned as it ended.
   */
  async cancel(sessionId: string, options: { wait?: boolean } = {}): Promise<Session | CancelAccepted> {
    try {
      return await this.client.cancelSession(sessionId, options);
    } catch (error) {
      if (!(error instanceof ConflictError)) throw error;
      const session = await this.client.getSession(sessionId);
      if (this.sessions.has(sessionId)) {
        this.sessions.set(sessionId, session);
        this.notify();
      }
      return session;
    }
  }

  // --- the loop ------------------------------------------------------------------------------

  private async followForever(first: string): Promise<void> {
    let cursor = first;
    try {
      while (!this.stop.signal.aborted) {
        await this.follow(cursor);
        if (this.stop.signal.aborted) return;
        cursor = await this.reconcile();
      }
    } catch (error) {
      if (this.stop.signal.aborted) return;
      this.failure = error; // not retryable (a revoked key): the picture stops here
      this.notify();
      throw error;
    }
  }

  /** Apply the owner stream from `cursor`; return when a new snapshot is due. */
  private async follow(cursor: string): Promise<void> {
    const period = new AbortController();
    const jitter = 0.9 + Math.random() * 0.2;
    const timer = setTimeout(() => period.abort(), this.reconcileIntervalMs * jitter);
    const signal = AbortSignal.any([this.stop.signal, period.signal]);
    const events = this.client.ownerEvents({
      cursor,
      onResync: "end",
      signal,
      onConnection: (connected) => this.onConnection(connected),
      onMalformed: (malformed) => this.onMalformed(null, malformed.frame.event),
    });
    try {
      for await (const event of events) {
        if (!(await this.apply(event))) return;
      }
    } catch (error) {
      if (!(error instanceof SnapshotDue)) throw error;
    } finally {
      clearTimeout(timer);
      await events.return(undefined);
    }
  }

  /** A new snapshot, retried until the server answers; its cursor. */
  private async reconcile(): Promise<string> {
    const backoff = this.client.backoff();
    for (;;) {
      try {
        return await this.snapshot();
      } catch (error) {
        if (!retryable(error)) throw error;
        this.setConnected(false);
      }
      await sleep(backoff.next(), this.stop.signal);
      if (this.stop.signal.aborted) return this.lastEventId ?? "0";
    }
  }

  /** Every page of the list (with a range, as many as were loaded). Streaming from the first
   * page's cursor misses nothing: a later page is newer, and the events it already shows set
   * the same values again. */
  private async snapshot(): Promise<string> {
    const sessions: Picture = new Map();
    let cursor: string | null = null;
    let pageToken: string | null = null;
    let pages = 0;
    do {
      const page = await this.page(pageToken);
      cursor ??= page.cursor;
      for (const session of page.sessions) sessions.set(session.id, session);
      pageToken = page.nextPageToken ?? null;
      pages += 1;
    } while (pageToken !== null && (this.range === null || pages < this.pagesWanted));
    this.sessions = sessions;
    this.nextPageToken = pageToken;
    this.lastEventId = cursor;
    this.gone.clear();
    this.malformed = 0;
    this.snapshots += 1;
    this.notify();
    return cursor;
  }

  private page(pageToken: string | null): Promise<SessionList> {
    const range = this.range;
    const params = range === null
      ? { limit: MAX_LIST_LIMIT, pageToken }
      : { limit: range.pageSize, pageToken, status: range.status, q: range.q || undefined };
    return this.client.listSessions(params, { signal: this.stop.signal });
  }

  // --- events ------------------------------------------------------------------------------

  /** Fold one frame in; false when a new snapshot must be taken first. */
  private async apply(event: StreamEvent): Promise<boolean> {
    if (event.type === "caught_up") {
      this.record(event, "control");
      this.setConnected(true);
      return true;
    }
    if (event.type === "resync_required") {
      this.record(event, "resync");
      return false;
    }
    if (event.id === null) return this.record(event, "control");
    if (!this.firstTime(event.id)) return this.record(event, "duplicate");
    const sessionId = event.sessionId;
    if (sessionId === null || (event.type === "session_created" && !isRecord(event.data.session))) {
      return this.onMalformed(event, event.type);
    }
    this.lastEventId = event.id;
    if (event.type === "session_created") {
      this.place(event.data.session as Session);
      this.gone.delete(sessionId);
    } else if (event.type === "session_deleted") {
      this.forget(sessionId);
    } else if (this.gone.has(sessionId)) {
      return this.record(event, "gone"); // a late event about a session deleted since
    } else if (!this.sessions.has(sessionId) && this.range !== null) {
      if (!(await this.pullIn(sessionId, event))) return this.record(event, "outside");
    } else if (!this.sessions.has(sessionId)) {
      this.record(event, "unknown_session");
      return false; // one the snapshot does not know
    } else if (!(await this.update(sessionId, event))) {
      this.record(event, "unknown_session");
      return false; // one that could not be fetched
    }
    this.record(event, "applied");
    this.notify();
    return true;
  }

  private firstTime(eventId: string): boolean {
    return this.lastEventId === null || BigInt(eventId) > BigInt(this.lastEventId);
  }

  private async update(sessionId: string, event: StreamEvent): Promise<boolean> {
    const update = LOCAL_UPDATES[event.type];
    const session = this.sessions.get(sessionId);
    if (update !== undefined && session !== undefined) this.place({ ...session, ...update(event.data) });
    if (update !== undefined && !REFETCH.has(event.type)) return true;
    return this.refetch(sessionId);
  }

  /** The session as it is now; false when the server cannot say (take a snapshot). */
  private async refetch(sessionId: string): Promise<boolean> {
    const session = await this.fetchSession(sessionId);
    if (session === undefined) return false;
    if (session === null) this.forget(sessionId);
    else this.place(session);
    return true;
  }

  /** A session outside a range that an event may have brought into its filter; whether the
   * picture took it (a failure to say is a snapshot due, thrown). */
  private async pullIn(sessionId: string, event: StreamEvent): Promise<boolean> {
    const range = this.range;
    const filtered = range !== null && (range.status.length > 0 || range.q !== "");
    if (!filtered || !MAY_MATCH.has(event.type)) return false;
    const session = await this.fetchSession(sessionId);
    if (session === undefined) throw new SnapshotDue();
    if (session === null) return false;
    this.place(session);
    return this.sessions.has(sessionId);
  }

  /** GET the session: null when it is gone, undefined when the server cannot say now. */
  private async fetchSession(sessionId: string): Promise<Session | null | undefined> {
    try {
      return await this.client.getSession(sessionId, { signal: this.stop.signal });
    } catch (error) {
      if (error instanceof NotFoundError) return null;
      if (retryable(error) || this.stop.signal.aborted) return undefined;
      throw error;
    }
  }

  /** Into the picture, or out of it when a range's filters or loaded pages no longer hold it. */
  private place(session: Session): void {
    if (this.belongs(session)) this.sessions.set(session.id, session);
    else this.sessions.delete(session.id);
  }

  private belongs(session: Session): boolean {
    const range = this.range;
    if (range === null) return true;
    if (range.status.length > 0 && !range.status.includes(session.status)) return false;
    if (range.q !== "" && !String(session.title ?? "").toLowerCase().includes(range.q.toLowerCase())) return false;
    return this.complete || this.sessions.has(session.id) || !this.olderThanLoaded(session);
  }

  /** Whether `session` comes after every loaded one (newest first, as the list pages). */
  private olderThanLoaded(session: Session): boolean {
    for (const loaded of this.sessions.values()) {
      if (loaded.createdAt < session.createdAt || (loaded.createdAt === session.createdAt && loaded.id <= session.id)) return false;
    }
    return this.sessions.size > 0;
  }

  private forget(sessionId: string): void {
    this.sessions.delete(sessionId);
    this.gone.add(sessionId);
  }

  /** A malformed event is skipped; `malformedLimit` of them since the last snapshot make a
   * new one due (the picture may have missed what they said). */
  private onMalformed(event: StreamEvent | null, type: string): boolean {
    this.malformed += 1;
    this.remember({ at: Date.now(), type, id: event?.id ?? null, sessionId: event?.sessionId ?? null, outcome: "malformed" });
    if (this.malformed < this.malformedLimit) return true;
    if (event === null) throw new SnapshotDue(); // from the stream's callback: end the period
    return false;
  }

  private record(event: StreamEvent, outcome: JournalOutcome): true {
    this.remember({ at: Date.now(), type: event.type, id: event.id, sessionId: event.sessionId, outcome });
    return true;
  }

  private remember(entry: JournalEntry): void {
    this.journal.push(entry);
    if (this.journal.length > this.journalSize) this.journal.splice(0, this.journal.length - this.journalSize);
  }

  private onConnection(connected: boolean): void {
    // Connected only counts once the backlog is in (`caught_up`); a loss counts at once.
    if (!connected) this.setConnected(false);
  }

  private setConnected(connected: boolean): void {
    if (connected) {
      clearTimeout(this.unhealthyTimer);
      this.unhealthyTimer = undefined;
      this.setHealthy(true);
    } else if (this.unhealthyTimer === undefined && !this.stop.signal.aborted) {
      this.unhealthyTimer = setTimeout(() => this.setHealthy(false), this.unhealthyAfterMs);
    }
    if (connected !== this.connected) {
      this.connected = connected;
      this.notify();
    }
  }

  private setHealthy(healthy: boolean): void {
    if (healthy === this.healthy) return;
    this.healthy = healthy;
    this.onHealthChange?.(healthy, this);
    this.notify();
  }

  private notify(): void {
    this.wake();
    this.onChange?.(this);
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }
}

function retryable(error: unknown): boolean {
  return error instanceof FerrymanConnectionError || (error instanceof FerrymanError && error.retryable);
}
