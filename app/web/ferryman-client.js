// @ferryman/client (clients/typescript) bundled for the workbench by `make web-client`: do not edit.

// src/errors.ts
var MAX_DETAIL_CHARS = 1e3;
var FerrymanError = class extends Error {
  status;
  /** The stable code (`SESSION_NOT_FOUND`, ...); `HTTP_<status>` for a body without one. */
  code;
  title;
  detail;
  errors;
  /** The answer's body as it came (a proxy's page becomes `{detail}`). */
  problem;
  constructor(status2, problem) {
    const code = typeof problem.code === "string" && problem.code ? problem.code : `HTTP_${status2}`;
    const title = typeof problem.title === "string" && problem.title ? problem.title : "Error";
    const detail = typeof problem.detail === "string" ? problem.detail : "";
    const errors = fieldErrors(problem.errors);
    super(message(status2, code, detail || title, errors));
    this.name = new.target.name;
    this.status = status2;
    this.code = code;
    this.title = title;
    this.detail = detail;
    this.errors = errors;
    this.problem = problem;
  }
  /** Whether the same request may succeed later (429, 5xx). */
  get retryable() {
    return this.status === 429 || this.status >= 500;
  }
};
var BadRequestError = class extends FerrymanError {
};
var AuthenticationError = class extends FerrymanError {
};
var PermissionDeniedError = class extends FerrymanError {
};
var NotFoundError = class extends FerrymanError {
};
var ConflictError = class extends FerrymanError {
};
var PayloadTooLargeError = class extends FerrymanError {
};
var UnsupportedMediaTypeError = class extends FerrymanError {
};
var UnprocessableEntityError = class extends FerrymanError {
};
var RateLimitError = class extends FerrymanError {
};
var InternalServerError = class extends FerrymanError {
};
var ServiceUnavailableError = class extends FerrymanError {
};
var BY_STATUS = {
  400: BadRequestError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  413: PayloadTooLargeError,
  415: UnsupportedMediaTypeError,
  422: UnprocessableEntityError,
  429: RateLimitError,
  503: ServiceUnavailableError
};
function errorClass(status2) {
  return BY_STATUS[status2] ?? (status2 >= 500 ? InternalServerError : FerrymanError);
}
async function apiError(response) {
  let text = "";
  try {
    text = await response.text();
  } catch {
  }
  const ErrorType = errorClass(response.status);
  return new ErrorType(response.status, problemOf(text));
}
function problemOf(text) {
  try {
    const body = JSON.parse(text);
    if (body !== null && typeof body === "object" && !Array.isArray(body)) {
      return body;
    }
  } catch {
  }
  return { detail: text.trim().slice(0, MAX_DETAIL_CHARS) };
}
function fieldErrors(raw) {
  if (!Array.isArray(raw)) return [];
  return raw.filter((e) => e !== null && typeof e === "object").map((e) => ({ field: String(e.field ?? ""), message: String(e.message ?? ""), type: String(e.type ?? "") }));
}
function message(status2, code, head, errors) {
  const named = errors.map(fieldText).filter((text) => !head.includes(text));
  return [`${status2} ${code}: ${head}`, ...named].join("; ");
}
function fieldText(error) {
  return error.field ? `${error.field}: ${error.message}` : error.message;
}
var FerrymanConnectionError = class extends Error {
  baseUrl;
  reason;
  constructor(baseUrl, reason, options) {
    super(`cannot reach Ferryman at ${baseUrl}: ${reason}; is \`ferryman serve\` running? (FERRYMAN_URL)`, options);
    this.name = "FerrymanConnectionError";
    this.baseUrl = baseUrl;
    this.reason = reason;
  }
};
function connectionReason(error) {
  let seen = error;
  let reason = "connection failed";
  for (let depth = 0; seen instanceof Error && depth < 5; depth += 1) {
    const code = seen.code;
    reason = typeof code === "string" ? code : seen.message || seen.name;
    seen = seen.cause;
  }
  return reason;
}

// src/events.ts
var StreamEvent = class {
  type;
  id;
  data;
  envelope;
  constructor(type, id, envelope) {
    this.type = type;
    this.id = id;
    const data = "type" in envelope ? envelope.data : envelope;
    this.data = isRecord(data) ? data : {};
    this.envelope = envelope;
  }
  get durable() {
    return this.id !== null && this.chunk === null;
  }
  /** A token delta's number among those that follow its `afterSeq` (1, 2, 3...). */
  get chunk() {
    const chunk = this.envelope.chunk;
    return Number.isInteger(chunk) && this.type === "message_delta" ? chunk : null;
  }
  get seq() {
    const seq = this.envelope.seq;
    return Number.isInteger(seq) ? seq : null;
  }
  get sessionId() {
    const id = this.envelope.sessionId;
    return id === void 0 || id === null ? null : String(id);
  }
  /** The envelope typed as the OpenAPI document has it (durable and ephemeral frames). */
  event() {
    return { id: this.id ?? "", ...this.envelope };
  }
};
function isRecord(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

// src/sse.ts
var SseParser = class {
  buffer = "";
  pendingCr = false;
  event = "";
  data = [];
  id = null;
  retry = null;
  /** The frames completed by `text` (the next piece of the decoded body). */
  feed(text) {
    const frames2 = [];
    if (text === "") return frames2;
    let input = text;
    if (this.pendingCr && input.startsWith("\n")) input = input.slice(1);
    this.pendingCr = false;
    this.buffer += input;
    let start = 0;
    for (let i = 0; i < this.buffer.length; i += 1) {
      const char = this.buffer[i];
      if (char !== "\n" && char !== "\r") continue;
      const frame = this.line(this.buffer.slice(start, i));
      if (frame !== null) frames2.push(frame);
      if (char === "\r") {
        if (i + 1 === this.buffer.length) this.pendingCr = true;
        else if (this.buffer[i + 1] === "\n") i += 1;
      }
      start = i + 1;
    }
    this.buffer = this.buffer.slice(start);
    return frames2;
  }
  line(line) {
    if (line === "") return this.dispatch();
    if (line.startsWith(":")) return null;
    const colon = line.indexOf(":");
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "event") this.event = value;
    else if (name === "data") this.data.push(value);
    else if (name === "id" && !value.includes("\0")) this.id = value;
    else if (name === "retry" && /^\d+$/.test(value)) this.retry = Number(value);
    return null;
  }
  dispatch() {
    const frame = {
      event: this.event || "message",
      data: this.data.join("\n"),
      id: this.id,
      retry: this.retry
    };
    const empty = this.data.length === 0;
    this.event = "";
    this.data = [];
    this.id = null;
    this.retry = null;
    return empty ? null : frame;
  }
};

// src/stream.ts
var Backoff = class {
  first;
  cap;
  delay;
  constructor(first, cap) {
    this.first = first;
    this.cap = cap;
    this.delay = first;
  }
  reset() {
    this.delay = this.first;
  }
  next() {
    const delay = this.delay * (0.5 + Math.random() / 2);
    this.delay = Math.min(this.delay * 2, this.cap);
    return delay;
  }
};
var Broken = class extends Error {
};
async function* streamEvents(transport, spec) {
  const state = new StreamState(spec, transport.backoff());
  const outer = spec.signal;
  while (!outer?.aborted) {
    const connection = new AbortController();
    const abort = () => connection.abort();
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
      connection.abort();
    }
    if (state.ended) return;
    await sleep(state.delay(), outer);
  }
}
async function* frames(transport, state, response, connection) {
  if (response.body === null) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  const idle = transport.streamIdleTimeoutMs;
  let timer;
  const arm = () => {
    if (idle === null) return;
    clearTimeout(timer);
    timer = setTimeout(() => connection.abort(new Broken("the stream went silent")), idle);
  };
  try {
    arm();
    for (; ; ) {
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
var StreamState = class {
  constructor(spec, backoff) {
    this.spec = spec;
    this.backoff = backoff;
    this.cursor = spec.cursor;
  }
  spec;
  backoff;
  cursor;
  ended = false;
  needsSnapshot = false;
  openedOnce = false;
  headers() {
    const headers = { Accept: "text/event-stream" };
    if (this.cursor !== null) headers["Last-Event-ID"] = this.cursor;
    return headers;
  }
  query() {
    return this.spec.follow ? {} : { follow: "false" };
  }
  async opened(response) {
    if (response.status >= 400) throw await apiError(response);
    this.openedOnce = true;
    this.backoff.reset();
    this.tell(true);
  }
  receive(frame) {
    let envelope;
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
  malformed(frame, reason) {
    if (this.spec.onMalformed === void 0) throw new Broken(reason);
    if (frame.id) this.cursor = frame.id;
    this.spec.onMalformed({ frame, reason });
    return null;
  }
  /** Whether to stop reading this connection. */
  get interrupted() {
    return this.ended || this.needsSnapshot;
  }
  closed() {
    if (!this.ended) this.tell(false);
  }
  /** A failure that means "connect again" returns; any other is thrown. */
  failed(error, baseUrl) {
    this.tell(false);
    if (error instanceof FerrymanError) {
      if (error.status === 404 && this.spec.endsOn404 && this.openedOnce) this.ended = true;
      else if (!error.retryable) throw error;
      return;
    }
    if (error instanceof FerrymanConnectionError || error instanceof Broken) return;
    if (error instanceof TypeError || error instanceof Error && error.name === "AbortError") return;
    if (error instanceof Error && /terminated|other side closed|socket/i.test(error.message)) return;
    throw error instanceof Error ? error : new FerrymanConnectionError(baseUrl, connectionReason(error));
  }
  delay() {
    return this.needsSnapshot ? 0 : this.backoff.next();
  }
  snapshot(cursor) {
    this.cursor = cursor;
    this.needsSnapshot = false;
  }
  tell(connected) {
    this.spec.onConnection?.(connected);
  }
};
function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

// src/client.ts
var DEFAULT_URL = "http://127.0.0.1:8000";
var OWNER_EVENTS = "/api/agent/owner-events";
var MAX_LIST_LIMIT = 200;
var MAX_TRANSCRIPT_LIMIT = 1e3;
function env(name) {
  const process = globalThis.process;
  return process?.env?.[name] || void 0;
}
function segment(value) {
  const encoded = encodeURIComponent(value);
  return encoded === "." || encoded === ".." ? encoded.replaceAll(".", "%2E") : encoded;
}
var sessionPath = (id) => `/api/agent/${segment(id)}`;
var assistantPath = (id) => `/api/assistants/${segment(id)}`;
var Ferryman = class {
  baseUrl;
  apiKey;
  timeoutMs;
  reconnectDelayMs;
  maxReconnectDelayMs;
  streamIdleTimeoutMs;
  fetcher;
  constructor(options = {}) {
    this.baseUrl = (options.baseUrl ?? env("FERRYMAN_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
    this.apiKey = (options.apiKey === void 0 ? env("FERRYMAN_API_KEY") : options.apiKey) || null;
    this.timeoutMs = options.timeoutMs ?? 3e4;
    this.reconnectDelayMs = options.reconnectDelayMs ?? 500;
    this.maxReconnectDelayMs = options.maxReconnectDelayMs ?? 1e4;
    this.streamIdleTimeoutMs = options.streamIdleTimeoutMs === void 0 ? 6e4 : options.streamIdleTimeoutMs;
    this.fetcher = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }
  // --- sessions ---------------------------------------------------------------------------
  /** POST /api/agent. With `idempotencyKey`, a repeat with the same body answers the same session. */
  createSession(body, options = {}) {
    const headers = options.idempotencyKey ? { "Idempotency-Key": options.idempotencyKey } : {};
    return this.json({ method: "POST", path: "/api/agent", body, headers, signal: options.signal });
  }
  /** GET /api/agent: newest first; `cursor` is where the owner stream goes on from. */
  listSessions(params = {}, options = {}) {
    const status2 = params.status === void 0 ? void 0 : [].concat(params.status);
    const query = { status: status2, limit: params.limit ?? 50, pageToken: params.pageToken, q: params.q };
    return this.json({ method: "GET", path: "/api/agent", query, signal: options.signal });
  }
  /** Every session (as its summary), page after page. */
  async *iterSessions(params = {}, options = {}) {
    let pageToken = null;
    do {
      const page = await this.listSessions({ ...params, limit: MAX_LIST_LIMIT, pageToken }, options);
      yield* page.sessions;
      pageToken = page.nextPageToken ?? null;
    } while (pageToken !== null);
  }
  getSession(sessionId, options = {}) {
    return this.json({ method: "GET", path: sessionPath(sessionId), signal: options.signal });
  }
  renameSession(sessionId, title, options = {}) {
    return this.json({ method: "PATCH", path: sessionPath(sessionId), body: { title }, signal: options.signal });
  }
  /** Soft delete; a session that is not terminal is cancelled first. */
  async deleteSession(sessionId, options = {}) {
    await this.send({ method: "DELETE", path: sessionPath(sessionId), signal: options.signal });
  }
  /** 202 CancelAccepted; with `wait`, the Session once terminal. 409
   * SESSION_ALREADY_TERMINAL is a ConflictError. */
  async cancelSession(sessionId, options = {}) {
    const query = { wait: options.wait ? "true" : "false" };
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/cancel`, query, signal: options.signal });
  }
  /** POST /api/agent/{id}/messages (operation `postMessage`). */
  sendMessage(sessionId, text, options = {}) {
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/messages`, body: { text }, signal: options.signal });
  }
  /** Approve or deny a call waiting for approval (operation `decideToolApproval`). */
  decideToolCall(sessionId, toolCallId, approved, reason, options = {}) {
    const body = reason === void 0 ? { approved } : { approved, reason };
    const path = `${sessionPath(sessionId)}/tool-calls/${segment(toolCallId)}/approval`;
    return this.json({ method: "POST", path, body, signal: options.signal });
  }
  /** The result of a client tool's call the session waits for (operation `postToolResult`). */
  postToolResult(sessionId, toolCallId, content, isError = false, options = {}) {
    const path = `${sessionPath(sessionId)}/tool-calls/${segment(toolCallId)}/result`;
    return this.json({ method: "POST", path, body: { content, isError }, signal: options.signal });
  }
  /** POST /api/agent/{id}/fork: 201 a new session whose history is this one's log through
   * `atSeq`; with `message`, the user message at `atSeq` replaced (edit and regenerate). */
  forkSession(sessionId, body, options = {}) {
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/fork`, body, signal: options.signal });
  }
  /** POST /api/agent/{id}/compact: 202, a compaction at the next turn (a waiting or finished
   * session is queued for it). 409 SESSION_NOT_COMPACTABLE is a ConflictError. */
  compactSession(sessionId, options = {}) {
    return this.json({ method: "POST", path: `${sessionPath(sessionId)}/compact`, signal: options.signal });
  }
  /** GET /api/agent/{id}/transcript: events after seq `after`. */
  transcript(sessionId, params = {}, options = {}) {
    const query = { after: params.after ?? 0, limit: params.limit ?? 200 };
    return this.json({ method: "GET", path: `${sessionPath(sessionId)}/transcript`, query, signal: options.signal });
  }
  /** Every event of the transcript after `after`, page after page. */
  async *iterTranscript(sessionId, params = {}, options = {}) {
    let after = params.after ?? 0;
    while (after !== null) {
      const page = await this.transcript(sessionId, { after, limit: MAX_TRANSCRIPT_LIMIT }, options);
      yield* page.events;
      after = page.nextAfter ?? null;
    }
  }
  listTools(options = {}) {
    return this.json({ method: "GET", path: "/api/tools", signal: options.signal });
  }
  // --- assistants -------------------------------------------------------------------------
  createAssistant(body, options = {}) {
    return this.json({ method: "POST", path: "/api/assistants", body, signal: options.signal });
  }
  listAssistants(params = {}, options = {}) {
    const metadata = params.metadata === void 0 ? void 0 : JSON.stringify(params.metadata);
    const query = { name: params.name, metadata, limit: params.limit ?? 50, pageToken: params.pageToken };
    return this.json({ method: "GET", path: "/api/assistants", query, signal: options.signal });
  }
  getAssistant(assistantId, options = {}) {
    return this.json({ method: "GET", path: assistantPath(assistantId), signal: options.signal });
  }
  /** A new version with `changes` (by wire name; null clears a field). */
  updateAssistant(assistantId, changes, options = {}) {
    return this.json({ method: "PATCH", path: assistantPath(assistantId), body: changes, signal: options.signal });
  }
  assistantVersions(assistantId, params = {}, options = {}) {
    const query = { limit: params.limit ?? 50, pageToken: params.pageToken };
    return this.json({ method: "GET", path: `${assistantPath(assistantId)}/versions`, query, signal: options.signal });
  }
  async deleteAssistant(assistantId, options = {}) {
    await this.send({ method: "DELETE", path: assistantPath(assistantId), signal: options.signal });
  }
  // --- streams ----------------------------------------------------------------------------
  /**
   * The session's log after seq `after` (none: from seq 1; a token delta's id `<seq>.<chunk>`:
   * after that chunk of the turn streaming then), then live, across reconnects. Ends when a
   * `follow: false` stream has caught up, when the session is deleted, or after a
   * `resync_required` (the cursor is ahead of the log), or when `signal` aborts.
   */
  sessionEvents(sessionId, params = {}) {
    return streamEvents(this, {
      path: `${sessionPath(sessionId)}/events`,
      cursor: params.after === void 0 || params.after === null ? null : String(params.after),
      onResync: "end",
      follow: params.follow ?? true,
      endsOn404: true,
      onConnection: params.onConnection,
      onMalformed: params.onMalformed,
      signal: params.signal
    });
  }
  /**
   * The owner's lifecycle feed after `cursor` (a list's `cursor`; none: live from now),
   * until `signal` aborts. `onResync: "snapshot"` (the default) yields `resync_required`, then
   * goes on from a fresh list snapshot's cursor: the caller should reload its own state then.
   */
  ownerEvents(params = {}) {
    return streamEvents(this, {
      path: OWNER_EVENTS,
      cursor: params.cursor ?? null,
      onResync: params.onResync ?? "snapshot",
      follow: true,
      endsOn404: false,
      onConnection: params.onConnection,
      onMalformed: params.onMalformed,
      signal: params.signal
    });
  }
  // --- what streams need (StreamTransport) ------------------------------------------------
  backoff() {
    return new Backoff(this.reconnectDelayMs, this.maxReconnectDelayMs);
  }
  open(path, headers, query, signal) {
    return this.fetchOrThrow(this.url(path, query), { method: "GET", headers: this.headers(headers), signal });
  }
  async listCursor(signal) {
    return (await this.listSessions({ limit: 1 }, { signal })).cursor;
  }
  // --- transport --------------------------------------------------------------------------
  async json(call) {
    const response = await this.send(call);
    const text = await response.text();
    return text ? JSON.parse(text) : null;
  }
  async send(call) {
    const headers = this.headers(call.headers ?? {});
    if (call.body !== void 0) headers["Content-Type"] = "application/json";
    const timeout = AbortSignal.timeout(this.timeoutMs);
    const signal = call.signal ? AbortSignal.any([call.signal, timeout]) : timeout;
    const init = { method: call.method, headers, signal };
    if (call.body !== void 0) init.body = JSON.stringify(call.body);
    const response = await this.fetchOrThrow(this.url(call.path, call.query ?? {}), init);
    if (response.status >= 400) throw await apiError(response);
    return response;
  }
  async fetchOrThrow(url, init) {
    try {
      return await this.fetcher(url, init);
    } catch (error) {
      if (init.signal?.aborted && init.signal.reason?.name !== "TimeoutError") throw error;
      const reason = init.signal?.reason?.name === "TimeoutError" ? "timed out" : connectionReason(error);
      throw new FerrymanConnectionError(this.baseUrl, reason, { cause: error });
    }
  }
  headers(extra) {
    const headers = { ...extra };
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    return headers;
  }
  url(path, query) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) {
      if (value === void 0 || value === null) continue;
      for (const item of Array.isArray(value) ? value : [value]) params.append(name, String(item));
    }
    const search = params.toString();
    return `${this.baseUrl}${path}${search ? `?${search}` : ""}`;
  }
};

// src/fold.ts
var INTERRUPTED = "worker interrupted";
function message2(role, text, seq, extra = {}) {
  return { role, text, seq, toolCallIds: [], stopReason: null, delivery: null, ...extra };
}
function toolCall(id, name = "", args = {}) {
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
    delegated: null
  };
}
var SessionFold = class {
  status;
  error = null;
  /** A pending `user_question`. */
  question = null;
  lastSeq = 0;
  draft = null;
  chunk = [0, 0];
  // (afterSeq, chunk) of the last delta applied
  turnEnded = 0;
  // seq of the last event that ended or dropped a turn
  list = [];
  calls = /* @__PURE__ */ new Map();
  summaries = [];
  constructor(options = {}) {
    this.status = options.status ?? null;
  }
  /** Where a stream of this session goes on from (`sessionEvents`' `after`): the last event's
   * seq, and while a turn streams, its chunks held too (`<seq>.<chunk>`, a delta's id), so a
   * reconnect sends only the chunks missed. */
  get cursor() {
    return this.draft !== null && this.chunk[1] > 0 ? `${this.lastSeq}.${this.chunk[1]}` : this.lastSeq;
  }
  /** The messages, and the turn streaming now (if any) last. */
  get messages() {
    return this.draft === null ? [...this.list] : [...this.list, message2("assistant", this.draft, null)];
  }
  /** Each `session_compacted`, oldest first: the latest is what the model sees now. */
  get compactions() {
    return [...this.summaries];
  }
  /** By id, in the order the model asked for them. */
  get toolCalls() {
    return new Map(this.calls);
  }
  snapshot() {
    return {
      messages: this.messages,
      toolCalls: [...this.calls.values()],
      status: this.status,
      error: this.error,
      question: this.question,
      lastSeq: this.lastSeq,
      draft: this.draft,
      compactions: this.compactions
    };
  }
  /** Fold in one frame; whether the picture changed. Control frames and durable events
   * already applied change nothing. */
  apply(event) {
    const { type, seq, data, envelope } = parts(event);
    if (seq === null) {
      if (type !== "message_delta") return false;
      const afterSeq = envelope.afterSeq;
      if (Number.isInteger(afterSeq) && afterSeq < this.turnEnded) return false;
      const chunk = chunkOf(envelope);
      if (chunk !== null) {
        if (before(chunk, this.chunk)) return false;
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
  applyAll(events) {
    let changed = false;
    for (const event of events) changed = this.apply(event) || changed;
    return changed;
  }
  /** The draft goes (replaced, retried or cut off), and deltas after an earlier event with it. */
  endTurn() {
    this.draft = null;
    this.turnEnded = this.lastSeq;
  }
  // --- one method per durable event type -------------------------------------------------
  userMessage(data) {
    const delivery = data.delivery === void 0 ? "queued" : str(data.delivery);
    this.list.push(message2("user", str(data.text), this.lastSeq, { delivery }));
    this.question = null;
    if (delivery === "queued") this.status = "queued";
  }
  started() {
    this.endTurn();
    this.status = "running";
    this.error = null;
  }
  resumed(data) {
    this.started();
    const repaired = data.repairedToolCalls ?? data.repairedToolCallIds;
    for (const id of Array.isArray(repaired) ? repaired.map(String) : []) {
      const call = this.calls.get(id) ?? toolCall(id);
      this.calls.set(id, { ...call, status: "failed", error: INTERRUPTED, interrupted: true });
    }
  }
  assistantMessage(data) {
    this.endTurn();
    const calls = (Array.isArray(data.toolCalls) ? data.toolCalls : []).filter(isRecord);
    for (const call of calls) {
      const id = str(call.id);
      if (!this.calls.has(id)) this.calls.set(id, toolCall(id, str(call.name), record(call.arguments)));
    }
    const text = data.text ? str(data.text) : "";
    if (text || calls.length > 0) {
      const stopReason = data.stopReason === void 0 || data.stopReason === null ? null : str(data.stopReason);
      this.list.push(message2("assistant", text, this.lastSeq, { toolCallIds: calls.map((c) => str(c.id)), stopReason }));
    }
  }
  call(data) {
    const id = str(data.toolCallId);
    return this.calls.get(id) ?? toolCall(id, str(data.name), record(data.arguments));
  }
  setCall(call, changes) {
    this.calls.set(call.id, { ...call, ...changes });
  }
  toolCallStart(data) {
    this.setCall(this.call(data), { status: "running" });
  }
  delegateCall(data) {
    this.setCall(this.call(data), { status: "running", childSessionId: str(data.childSessionId) || null });
  }
  /** The child ended: the call still runs until the parent's next run answers it. */
  delegateResult(data) {
    const answer = data.answer === void 0 || data.answer === null ? null : str(data.answer);
    const error = isRecord(data.error) ? { ...data.error } : null;
    const childSessionId = str(data.childSessionId) || null;
    this.setCall(this.call(data), { childSessionId, delegated: { status: str(data.status), answer, error } });
  }
  toolResult(data) {
    const content = str(data.content);
    const status2 = data.denied ? "denied" : data.isError ? "failed" : "succeeded";
    this.setCall(this.call(data), {
      status: status2,
      result: content,
      error: status2 === "succeeded" ? null : content,
      timedOut: Boolean(data.timedOut),
      interrupted: Boolean(data.interrupted)
    });
  }
  approvalRequested(data) {
    this.setCall(this.call(data), { status: "awaiting_approval" });
  }
  approvalDecided(data) {
    const call = this.call(data);
    if (data.approved) this.setCall(call, { status: "approved" });
    else this.setCall(call, { status: "denied", error: data.reason ? str(data.reason) : "denied" });
    if (this.status === "waiting") this.status = "queued";
  }
  userQuestion(data) {
    this.question = { ...data };
  }
  turnDropped() {
    this.endTurn();
  }
  compacted(data) {
    this.summaries.push({
      seq: this.lastSeq,
      throughSeq: int(data.throughSeq),
      summary: str(data.summary),
      tokensBefore: int(data.tokensBefore),
      tokensAfter: int(data.tokensAfter),
      model: str(data.model)
    });
  }
  sessionEnd(data) {
    this.endTurn();
    if (data.status !== void 0) this.status = str(data.status);
    this.error = isRecord(data.error) ? { ...data.error } : null;
  }
};
var methods = SessionFold.prototype;
var HANDLERS = {
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
  session_compacted: methods.compacted
};
function parts(event) {
  if (event instanceof StreamEvent) {
    return { type: event.type, seq: event.durable ? event.seq : null, data: event.data, envelope: event.envelope };
  }
  const seq = Number.isInteger(event.seq) ? event.seq : null;
  return { type: str(event.type), seq, data: record(event.data), envelope: event };
}
function chunkOf(envelope) {
  const { afterSeq, chunk } = envelope;
  return Number.isInteger(afterSeq) && Number.isInteger(chunk) ? [afterSeq, chunk] : null;
}
function before(a, b) {
  return a[0] < b[0] || a[0] === b[0] && a[1] <= b[1];
}
function str(value) {
  return value === void 0 || value === null ? "" : String(value);
}
function int(value) {
  return Number.isInteger(value) ? value : 0;
}
function record(value) {
  return isRecord(value) ? { ...value } : {};
}

// src/live.ts
function status(data) {
  const change = { status: data.status, error: data.error ?? null };
  if (Number.isInteger(data.attempt)) change.attempt = data.attempt;
  return change;
}
var LOCAL_UPDATES = {
  session_title: (data) => ({ title: String(data.title ?? "") }),
  session_active_stage: (data) => ({ activeStage: data.stage ?? null }),
  session_cancel_requested: () => ({ cancelRequested: true }),
  session_status: status
};
var REFETCH = /* @__PURE__ */ new Set(["session_status"]);
var MAY_MATCH = /* @__PURE__ */ new Set(["session_status", "session_title"]);
var SnapshotDue = class extends Error {
};
var OwnerSessionClient = class {
  client;
  reconcileIntervalMs;
  unhealthyAfterMs;
  malformedLimit;
  journalSize;
  range;
  onChange;
  onHealthChange;
  sessions = /* @__PURE__ */ new Map();
  connected = false;
  /** False once reconnects have failed for `unhealthyAfterMs`; true again on `caught_up`. */
  healthy = true;
  /** The last owner event applied. */
  lastEventId = null;
  /** List snapshots taken, the first one included. */
  snapshots = 0;
  /** Malformed events since the last snapshot. */
  malformed = 0;
  journal = [];
  gone = /* @__PURE__ */ new Set();
  // deleted since the snapshot: their late events are moot
  waiters = [];
  stop = new AbortController();
  task = null;
  failure = null;
  unhealthyTimer;
  pagesWanted = 1;
  // with a range: the pages a snapshot takes
  nextPageToken = null;
  constructor(client, options = {}) {
    this.client = client;
    this.reconcileIntervalMs = options.reconcileIntervalMs ?? 6e4;
    this.unhealthyAfterMs = options.unhealthyAfterMs ?? 45e3;
    this.malformedLimit = options.malformedLimit ?? 5;
    this.journalSize = options.journalSize ?? 200;
    const range = options.range;
    this.range = range === void 0 ? null : { status: range.status ?? [], q: (range.q ?? "").trim(), pageSize: range.pageSize ?? 50 };
    this.onChange = options.onChange;
    this.onHealthChange = options.onHealthChange;
  }
  /** Take the first snapshot (its errors are thrown here), then follow in the background. */
  async start() {
    const cursor = await this.snapshot();
    this.task = this.followForever(cursor).catch(() => void 0);
    return this;
  }
  /** Keep the picture current until `close()` or a fatal error (thrown). */
  async run() {
    await this.followForever(await this.snapshot());
  }
  /** Stop following. An error that stopped it already is `error` (and `changes()`'s). */
  async close() {
    this.stop.abort();
    clearTimeout(this.unhealthyTimer);
    await this.task;
    this.task = null;
    this.wake();
  }
  /** Whether the picture holds every session of its range (always, without a range). */
  get complete() {
    return this.nextPageToken === null;
  }
  /** With a range: the next page into the picture (and every later snapshot); false when
   * there is none. */
  async loadMore() {
    const token = this.nextPageToken;
    if (this.range === null || token === null) return false;
    const snapshots = this.snapshots;
    this.pagesWanted += 1;
    const page = await this.page(token);
    if (snapshots !== this.snapshots) return true;
    for (const session of page.sessions) if (!this.gone.has(session.id)) this.sessions.set(session.id, session);
    this.nextPageToken = page.nextPageToken ?? null;
    this.notify();
    return true;
  }
  /** What stopped the picture (a revoked key, say), if anything did. */
  get error() {
    return this.failure;
  }
  /** The picture now, then after each change (changes that come together are yielded once).
   * Throws what stopped the picture; ends after `close()`. */
  async *changes() {
    for (; ; ) {
      const changed = new Promise((resolve) => this.waiters.push(resolve));
      if (this.failure !== null) throw this.failure;
      yield new Map(this.sessions);
      if (this.stop.signal.aborted) return;
      await changed;
    }
  }
  /** The first picture, this one included, for which `predicate` holds. */
  async waitUntil(predicate, timeoutMs) {
    let timer;
    const changes = this.changes();
    const expired = new Promise((_, reject) => {
      if (timeoutMs !== void 0) timer = setTimeout(() => reject(new Error(`waitUntil: not within ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      for (; ; ) {
        const next = await Promise.race([changes.next(), expired]);
        if (next.done) throw new Error("waitUntil: the picture was closed");
        if (predicate(next.value)) return next.value;
      }
    } finally {
      clearTimeout(timer);
      void changes.return(void 0);
    }
  }
  /**
   * Cancel a session. 409 SESSION_ALREADY_TERMINAL means it ended before the cancel came:
   * not an error here, the session is read again and returned as it ended.
   */
  async cancel(sessionId, options = {}) {
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
  async followForever(first) {
    let cursor = first;
    try {
      while (!this.stop.signal.aborted) {
        await this.follow(cursor);
        if (this.stop.signal.aborted) return;
        cursor = await this.reconcile();
      }
    } catch (error) {
      if (this.stop.signal.aborted) return;
      this.failure = error;
      this.notify();
      throw error;
    }
  }
  /** Apply the owner stream from `cursor`; return when a new snapshot is due. */
  async follow(cursor) {
    const period = new AbortController();
    const jitter = 0.9 + Math.random() * 0.2;
    const timer = setTimeout(() => period.abort(), this.reconcileIntervalMs * jitter);
    const signal = AbortSignal.any([this.stop.signal, period.signal]);
    const events = this.client.ownerEvents({
      cursor,
      onResync: "end",
      signal,
      onConnection: (connected) => this.onConnection(connected),
      onMalformed: (malformed) => this.onMalformed(null, malformed.frame.event)
    });
    try {
      for await (const event of events) {
        if (!await this.apply(event)) return;
      }
    } catch (error) {
      if (!(error instanceof SnapshotDue)) throw error;
    } finally {
      clearTimeout(timer);
      await events.return(void 0);
    }
  }
  /** A new snapshot, retried until the server answers; its cursor. */
  async reconcile() {
    const backoff = this.client.backoff();
    for (; ; ) {
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
  async snapshot() {
    const sessions = /* @__PURE__ */ new Map();
    let cursor = null;
    let pageToken = null;
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
  page(pageToken) {
    const range = this.range;
    const params = range === null ? { limit: MAX_LIST_LIMIT, pageToken } : { limit: range.pageSize, pageToken, status: range.status, q: range.q || void 0 };
    return this.client.listSessions(params, { signal: this.stop.signal });
  }
  // --- events ------------------------------------------------------------------------------
  /** Fold one frame in; false when a new snapshot must be taken first. */
  async apply(event) {
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
    if (sessionId === null || event.type === "session_created" && !isRecord(event.data.session)) {
      return this.onMalformed(event, event.type);
    }
    this.lastEventId = event.id;
    if (event.type === "session_created") {
      this.place(event.data.session);
      this.gone.delete(sessionId);
    } else if (event.type === "session_deleted") {
      this.forget(sessionId);
    } else if (this.gone.has(sessionId)) {
      return this.record(event, "gone");
    } else if (!this.sessions.has(sessionId) && this.range !== null) {
      if (!await this.pullIn(sessionId, event)) return this.record(event, "outside");
    } else if (!this.sessions.has(sessionId)) {
      this.record(event, "unknown_session");
      return false;
    } else if (!await this.update(sessionId, event)) {
      this.record(event, "unknown_session");
      return false;
    }
    this.record(event, "applied");
    this.notify();
    return true;
  }
  firstTime(eventId) {
    return this.lastEventId === null || BigInt(eventId) > BigInt(this.lastEventId);
  }
  async update(sessionId, event) {
    const update = LOCAL_UPDATES[event.type];
    const session = this.sessions.get(sessionId);
    if (update !== void 0 && session !== void 0) this.place({ ...session, ...update(event.data) });
    if (update !== void 0 && !REFETCH.has(event.type)) return true;
    return this.refetch(sessionId);
  }
  /** The session as it is now; false when the server cannot say (take a snapshot). */
  async refetch(sessionId) {
    const session = await this.fetchSession(sessionId);
    if (session === void 0) return false;
    if (session === null) this.forget(sessionId);
    else this.place(session);
    return true;
  }
  /** A session outside a range that an event may have brought into its filter; whether the
   * picture took it (a failure to say is a snapshot due, thrown). */
  async pullIn(sessionId, event) {
    const range = this.range;
    const filtered = range !== null && (range.status.length > 0 || range.q !== "");
    if (!filtered || !MAY_MATCH.has(event.type)) return false;
    const session = await this.fetchSession(sessionId);
    if (session === void 0) throw new SnapshotDue();
    if (session === null) return false;
    this.place(session);
    return this.sessions.has(sessionId);
  }
  /** GET the session: null when it is gone, undefined when the server cannot say now. */
  async fetchSession(sessionId) {
    try {
      return await this.client.getSession(sessionId, { signal: this.stop.signal });
    } catch (error) {
      if (error instanceof NotFoundError) return null;
      if (retryable(error) || this.stop.signal.aborted) return void 0;
      throw error;
    }
  }
  /** Into the picture, or out of it when a range's filters or loaded pages no longer hold it. */
  place(session) {
    if (this.belongs(session)) this.sessions.set(session.id, session);
    else this.sessions.delete(session.id);
  }
  belongs(session) {
    const range = this.range;
    if (range === null) return true;
    if (range.status.length > 0 && !range.status.includes(session.status)) return false;
    if (range.q !== "" && !String(session.title ?? "").toLowerCase().includes(range.q.toLowerCase())) return false;
    return this.complete || this.sessions.has(session.id) || !this.olderThanLoaded(session);
  }
  /** Whether `session` comes after every loaded one (newest first, as the list pages). */
  olderThanLoaded(session) {
    for (const loaded of this.sessions.values()) {
      if (loaded.createdAt < session.createdAt || loaded.createdAt === session.createdAt && loaded.id <= session.id) return false;
    }
    return this.sessions.size > 0;
  }
  forget(sessionId) {
    this.sessions.delete(sessionId);
    this.gone.add(sessionId);
  }
  /** A malformed event is skipped; `malformedLimit` of them since the last snapshot make a
   * new one due (the picture may have missed what they said). */
  onMalformed(event, type) {
    this.malformed += 1;
    this.remember({ at: Date.now(), type, id: event?.id ?? null, sessionId: event?.sessionId ?? null, outcome: "malformed" });
    if (this.malformed < this.malformedLimit) return true;
    if (event === null) throw new SnapshotDue();
    return false;
  }
  record(event, outcome) {
    this.remember({ at: Date.now(), type: event.type, id: event.id, sessionId: event.sessionId, outcome });
    return true;
  }
  remember(entry) {
    this.journal.push(entry);
    if (this.journal.length > this.journalSize) this.journal.splice(0, this.journal.length - this.journalSize);
  }
  onConnection(connected) {
    if (!connected) this.setConnected(false);
  }
  setConnected(connected) {
    if (connected) {
      clearTimeout(this.unhealthyTimer);
      this.unhealthyTimer = void 0;
      this.setHealthy(true);
    } else if (this.unhealthyTimer === void 0 && !this.stop.signal.aborted) {
      this.unhealthyTimer = setTimeout(() => this.setHealthy(false), this.unhealthyAfterMs);
    }
    if (connected !== this.connected) {
      this.connected = connected;
      this.notify();
    }
  }
  setHealthy(healthy) {
    if (healthy === this.healthy) return;
    this.healthy = healthy;
    this.onHealthChange?.(healthy, this);
    this.notify();
  }
  notify() {
    this.wake();
    this.onChange?.(this);
  }
  wake() {
    const waiters = this.waiters;
    this.waiters = [];
    for (const resolve of waiters) resolve();
  }
};
function retryable(error) {
  return error instanceof FerrymanConnectionError || error instanceof FerrymanError && error.retryable;
}
export {
  AuthenticationError,
  Backoff,
  BadRequestError,
  ConflictError,
  DEFAULT_URL,
  Ferryman,
  FerrymanConnectionError,
  FerrymanError,
  INTERRUPTED,
  InternalServerError,
  MAX_LIST_LIMIT,
  MAX_TRANSCRIPT_LIMIT,
  NotFoundError,
  OWNER_EVENTS,
  OwnerSessionClient,
  PayloadTooLargeError,
  PermissionDeniedError,
  RateLimitError,
  ServiceUnavailableError,
  SessionFold,
  SseParser,
  StreamEvent,
  UnprocessableEntityError,
  UnsupportedMediaTypeError,
  apiError,
  connectionReason,
  errorClass,
  segment
};
