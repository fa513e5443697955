// A session's log folded into a conversation: pure data, no DOM, no I/O.
//
// Feed `apply` the frames of the session stream in the order they come (or a transcript's
// events). A durable event (it has a seq) is applied once: a replay after a reconnect changes
// nothing, nor does a token delta's (numbered by its `chunk`). Streamed text (`message_delta`,
// no seq) is a draft until its turn ends: the `assistant_message` replaces it, and a retried
// (`model_retry`), interrupted or resumed turn drops it, so a partial answer is replaced, never
// shown twice.
//
// `items` is the conversation in order; every item has a stable `key` and a `rev` that grows
// each time the item changes, so a renderer redraws only what changed.

export const TERMINAL = new Set(['succeeded', 'failed', 'cancelled']);

// Tool card states, and what a person reads for each.
export const TOOL_STATES = {
  pending: 'queued',
  awaiting_approval: 'needs approval',
  approved: 'approved',
  running: 'running',
  succeeded: 'succeeded',
  failed: 'failed',
  timed_out: 'timed out',
  interrupted: 'interrupted',
  denied: 'denied',
  cancelled: 'cancelled',
};

// Stop reasons of a turn that resume planning strips (SPEC section 5): the turn is played again.
const REPLAYED_STOPS = new Set(['aborted', 'length', 'error']);
const UNFINISHED_CALLS = new Set(['pending', 'approved', 'running', 'interrupted']);

export function shortWorker(workerId) {
  const text = String(workerId || '');
  return text.length > 18 ? `${text.slice(0, 17)}…` : text;
}

export function seconds(ms) {
  const s = Number(ms || 0) / 1000;
  return s < 10 ? s.toFixed(1).replace(/\.0$/, '') : String(Math.round(s));
}

export function interruptedLabel(cause) {
  if (cause === 'crash') return 'interrupted by a worker crash';
  if (cause === 'shutdown') return 'interrupted: its worker shut down';
  return 'interrupted';
}

export class Conversation {
  constructor() {
    this.lastSeq = 0;
    this.status = null; // what the log says: queued, running, waiting or a terminal status
    this.error = null;
    this.items = [];
    this.calls = new Map(); // tool call id -> its card (an item of `items`)
    this.draft = null; // {key, text, afterSeq, rev} while a turn streams
    this.events = []; // every durable event, for the raw log
    this.question = null; // the `user_question` item waiting for an answer
    this.dropSeq = 0; // seq of the last event that ended or dropped a turn
    this.chunkSeen = [0, 0]; // [afterSeq, chunk] of the last token delta applied
    this.rev = 0;
  }

  // Where a stream resumes: after the last event, and while a turn streams, after its chunks
  // held (`<seq>.<chunk>`, a delta's id), so that a reconnect sends only the chunks missed.
  get cursor() {
    return this.draft && this.chunkSeen[1] ? `${this.lastSeq}.${this.chunkSeen[1]}` : this.lastSeq;
  }

  // Fold in one frame (an envelope `{type, seq?, afterSeq?, data}`); whether anything changed.
  apply(event) {
    if (event.type === 'message_delta') return this.delta(event);
    const seq = Number(event.seq);
    if (!Number.isInteger(seq) || seq <= this.lastSeq) return false;
    this.lastSeq = seq;
    this.events.push(event);
    const handler = HANDLERS[event.type];
    if (handler) handler.call(this, seq, event.data || {}, event);
    this.rev += 1;
    return true;
  }

  applyAll(events) {
    let changed = false;
    for (const event of events) changed = this.apply(event) || changed;
    return changed;
  }

  // The items and, last, the turn streaming now.
  get view() {
    return this.draft ? [...this.items, this.draftItem()] : this.items;
  }

  get pendingApprovals() {
    return [...this.calls.values()].filter((c) => c.status === 'awaiting_approval');
  }

  draftItem() {
    const d = this.draft;
    return {kind: 'assistant', key: d.key, rev: d.rev, text: d.text, streaming: true, toolCallIds: []};
  }

  delta(event) {
    const after = Number(event.afterSeq ?? this.lastSeq);
    // Text of a turn that has ended or was dropped since (its deltas came late): stale.
    if (after < this.dropSeq) return false;
    // A numbered chunk the draft already has: a reconnect from an event mid-turn replays the
    // turn's stored chunks.
    const chunk = Number(event.chunk ?? 0);
    if (chunk) {
      const [seenAfter, seenChunk] = this.chunkSeen;
      if (after < seenAfter || (after === seenAfter && chunk <= seenChunk)) return false;
      this.chunkSeen = [after, chunk];
    }
    const text = String(event.data?.text ?? '');
    if (!this.draft) this.draft = {key: `draft-${after}-${this.dropSeq}`, text: '', afterSeq: after, rev: 0};
    this.draft.text += text;
    this.draft.rev += 1;
    this.rev += 1;
    return true;
  }

  dropDraft(seq) {
    this.draft = null;
    this.dropSeq = seq;
  }

  push(item) {
    item.rev = 1;
    this.items.push(item);
    return item;
  }

  touch(item, changes) {
    Object.assign(item, changes);
    item.rev += 1;
  }

  marker(seq, tone, text, detail = '') {
    return this.push({kind: 'marker', key: `m${seq}`, seq, tone, text, detail});
  }

  card(data) {
    const id = String(data.toolCallId ?? data.id ?? '');
    let call = this.calls.get(id);
    if (!call) {
      call = this.push({
        kind: 'tool', key: `t${id}`, id, name: String(data.name ?? ''),
        arguments: data.arguments ?? {}, status: 'pending', result: null, cause: null,
        startedAt: null, endedAt: null,
      });
      this.calls.set(id, call);
    }
    return call;
  }

  // --- one method per durable event type -------------------------------------------------

  userMessage(seq, data) {
    const delivery = String(data.delivery || 'queued');
    if (this.question) {
      this.touch(this.question, {answered: true, answer: String(data.text ?? '')});
      this.question = null;
    }
    // A message instead of a decision denies the pending approvals: `tool_approval_decided`
    // events say so, and turn those cards `denied`.
    this.push({kind: 'user', key: `u${seq}`, seq, text: String(data.text ?? ''), delivery});
    if (delivery === 'queued') this.status = 'queued';
  }

  started(seq, data) {
    this.dropDraft(seq);
    this.status = 'running';
    this.error = null;
    const worker = shortWorker(data.workerId);
    this.marker(seq, 'quiet', `Started on ${worker} · attempt ${data.attempt}`, `pid ${data.pid}`);
  }

  resumed(seq, data) {
    this.dropDraft(seq);
    this.status = 'running';
    this.error = null;
    const reason = String(data.reason || '');
    // A turn cut short (stopped, at its limit, failed) is played again: its partial text goes.
    let end = this.items.length;
    while (end > 0) {
      const item = this.items[end - 1];
      if (item.kind === 'marker') { end -= 1; continue; }
      if (item.kind === 'assistant' && REPLAYED_STOPS.has(item.stopReason) && !item.toolCallIds.length) {
        this.items.splice(end - 1, 1);
        end -= 1;
        continue;
      }
      break;
    }
    const repaired = (data.repairedToolCalls || []).map(String);
    for (const id of repaired) {
      const call = this.calls.get(id) || this.card({toolCallId: id, name: ''});
      this.touch(call, {status: 'interrupted', cause: reason});
    }
    const where = `${shortWorker(data.workerId)} at attempt ${data.attempt}`;
    const repairs = repaired.length
      ? `${repaired.length} tool call${repaired.length > 1 ? 's' : ''} interrupted`
      : '';
    if (reason === 'crash') {
      this.marker(seq, 'warn', `Worker died, resumed on ${where}`, repairs);
    } else if (reason === 'shutdown') {
      this.marker(seq, 'warn', `Worker shut down, resumed on ${where}`, repairs);
    } else {
      // A follow-up (a message or an approval after a run that finished): a new run, no resume.
      this.marker(seq, 'quiet', `Continued on ${shortWorker(data.workerId)} · attempt ${data.attempt}`, repairs);
    }
  }

  assistantMessage(seq, data) {
    this.dropDraft(seq);
    const calls = (data.toolCalls || []).filter((c) => c && typeof c === 'object');
    const text = String(data.text ?? '');
    const stopReason = String(data.stopReason || 'stop');
    if (text || stopReason === 'aborted') {
      this.push({
        kind: 'assistant', key: `a${seq}`, seq, text, stopReason, streaming: false,
        usage: data.usage || null, toolCallIds: calls.map((c) => String(c.id)),
      });
    }
    for (const call of calls) this.card({...call, toolCallId: call.id});
  }

  toolCallStart(seq, data, event) {
    const call = this.card(data);
    this.touch(call, {status: 'running', startedAt: event.ts || null});
  }

  toolResult(seq, data, event) {
    const call = this.card(data);
    let status = 'succeeded';
    if (data.denied) status = 'denied';
    else if (data.timedOut) status = 'timed_out';
    else if (data.interrupted) status = 'interrupted';
    else if (data.isError) status = 'failed';
    this.touch(call, {status, result: String(data.content ?? ''), endedAt: event.ts || null});
  }

  approvalRequested(seq, data) {
    const call = this.card(data);
    this.touch(call, {status: 'awaiting_approval'});
  }

  approvalDecided(seq, data) {
    const call = this.card(data);
    if (data.approved) this.touch(call, {status: 'approved'});
    else this.touch(call, {status: 'denied', result: data.reason ? `denied: ${data.reason}` : 'denied'});
    const name = call.name || 'the tool call';
    this.marker(seq, 'quiet', `${data.approved ? 'Approved' : 'Denied'} ${name}`, data.reason ? String(data.reason) : '');
    if (this.status === 'waiting') this.status = 'queued';
  }

  userQuestion(seq, data) {
    const options = Array.isArray(data.options) ? data.options.map(String) : [];
    this.question = this.push({
      kind: 'question', key: `q${seq}`, seq, question: String(data.question ?? ''), options,
      answered: false, answer: null,
    });
  }

  modelRetry(seq, data) {
    this.dropDraft(seq);
    const why = [data.reason, data.message].filter(Boolean).join(': ');
    this.marker(seq, 'warn', `Provider busy, retrying in ${seconds(data.delayMs)} s`,
      `retry ${data.attempt}${why ? ` · ${why}` : ''}`);
  }

  interrupted(seq, data) {
    this.dropDraft(seq);
    const reason = String(data.reason || '');
    const text = reason === 'shutdown' ? 'Worker shutting down: handing the session over' : `Interrupted: ${reason}`;
    this.marker(seq, 'warn', text);
  }

  sessionEnd(seq, data) {
    this.dropDraft(seq);
    const status = String(data.status || '');
    this.status = status;
    this.error = data.error && typeof data.error === 'object' ? data.error : null;
    if (status === 'cancelled') {
      for (const call of this.calls.values()) {
        if (UNFINISHED_CALLS.has(call.status) && !call.cause) this.touch(call, {status: 'cancelled'});
      }
    }
    if (status === 'succeeded') this.marker(seq, 'ok', 'Finished');
    else if (status === 'cancelled') this.marker(seq, 'quiet', 'Cancelled');
    else if (status === 'waiting') {
      let text = 'Waiting for a message';
      if (this.question) text = 'Waiting for your answer';
      else if (this.pendingApprovals.length) text = 'Waiting for your approval';
      this.marker(seq, 'info', text, data.note ? String(data.note) : '');
    } else if (status === 'failed') {
      const error = this.error || {};
      this.marker(seq, 'error', `Failed${error.code ? `: ${error.code}` : ''}`, String(error.message || ''));
    } else {
      this.marker(seq, 'quiet', `Ended: ${status}`);
    }
  }
}

const HANDLERS = {
  user_message: Conversation.prototype.userMessage,
  session_start: Conversation.prototype.started,
  session_resumed: Conversation.prototype.resumed,
  assistant_message: Conversation.prototype.assistantMessage,
  tool_call_start: Conversation.prototype.toolCallStart,
  tool_result: Conversation.prototype.toolResult,
  tool_approval_requested: Conversation.prototype.approvalRequested,
  tool_approval_decided: Conversation.prototype.approvalDecided,
  user_question: Conversation.prototype.userQuestion,
  model_retry: Conversation.prototype.modelRetry,
  session_interrupted: Conversation.prototype.interrupted,
  session_end: Conversation.prototype.sessionEnd,
};
