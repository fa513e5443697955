// A session's log as the chat shows it: pure data, no DOM, no I/O.
//
// The fold itself is the package's SessionFold (ferryman-client.js): it applies each durable
// event once (a replay after a reconnect changes nothing, nor does a numbered token delta), keeps
// streamed text as a draft until its turn ends, and says the status, the error, and each tool
// call's state. This adds what a chat draws: `items`, the conversation in order with markers
// for starts, resumes, retries, compactions and ends; every item has a stable `key` and a `rev` that grows
// each time the item changes, so a renderer redraws only what changed.

import {SessionFold} from './ferryman-client.js';

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
    this.fold = new SessionFold();
    this.items = [];
    this.calls = new Map(); // tool call id -> its card (an item of `items`)
    this.events = []; // every durable event, for the raw log
    this.question = null; // the `user_question` item waiting for an answer
    this.draftKey = null; // the streaming turn's item key, new for each turn
    this.draftRev = 0;
    this.rev = 0;
    this.userSeq = null; // the latest user message's seq: where a retry of what follows forks
  }

  // Where the session stream goes on from (`<seq>.<chunk>` mid-turn).
  get cursor() {
    return this.fold.cursor;
  }

  // What the log says: queued, running, waiting or a terminal status.
  get status() {
    return this.fold.status;
  }

  // The streaming turn's item, null between turns.
  get draft() {
    return this.fold.draft === null ? null : this.draftItem();
  }

  // Fold in one frame (an envelope `{type, seq?, afterSeq?, chunk?, data}`); whether anything
  // changed.
  apply(event) {
    const streaming = this.fold.draft !== null;
    if (!this.fold.apply(event)) return false;
    this.rev += 1;
    if (event.type === 'message_delta') {
      if (!streaming) this.draftKey = `draft-${this.fold.lastSeq}-${this.rev}`;
      this.draftRev += 1;
      return true;
    }
    this.events.push(event);
    const handler = HANDLERS[event.type];
    if (handler) handler.call(this, this.fold.lastSeq, event.data || {}, event);
    return true;
  }

  // The items and, last, the turn streaming now.
  get view() {
    return this.draft ? [...this.items, this.draftItem()] : this.items;
  }

  get pendingApprovals() {
    return [...this.calls.values()].filter((c) => c.status === 'awaiting_approval');
  }

  draftItem() {
    return {kind: 'assistant', key: this.draftKey, rev: this.draftRev, text: this.fold.draft, streaming: true, toolCallIds: []};
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
        kind: 'tool', key: `t${id}`, id, seq: this.fold.lastSeq, name: String(data.name ?? ''),
        arguments: data.arguments ?? {}, status: 'pending', result: null, cause: null,
        startedAt: null, endedAt: null, childSessionId: null, delegated: null, child: null,
      });
      this.calls.set(id, call);
    }
    return call;
  }

  // A card's state as the fold has its call (a failure that timed out, or that a worker's
  // death cut short, has words of its own), with `changes` of the chat's.
  sync(card, changes = {}) {
    const call = this.fold.toolCalls.get(card.id);
    let status = call?.status ?? card.status;
    if (status === 'failed' && call.timedOut) status = 'timed_out';
    else if (status === 'failed' && call.interrupted) status = 'interrupted';
    this.touch(card, {...changes, status});
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
    this.userSeq = seq;
  }

  started(seq, data) {
    const worker = shortWorker(data.workerId);
    this.marker(seq, 'quiet', `Started on ${worker} · attempt ${data.attempt}`, `pid ${data.pid}`);
  }

  resumed(seq, data) {
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
      this.sync(call, {cause: reason});
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
    const calls = (data.toolCalls || []).filter((c) => c && typeof c === 'object');
    const text = String(data.text ?? '');
    const stopReason = String(data.stopReason || 'stop');
    if (text || stopReason === 'aborted') {
      this.push({
        kind: 'assistant', key: `a${seq}`, seq, text, stopReason, streaming: false,
        usage: data.usage || null, toolCallIds: calls.map((c) => String(c.id)), userSeq: this.userSeq,
      });
    }
    for (const call of calls) this.card({...call, toolCallId: call.id});
  }

  toolCallStart(seq, data, event) {
    this.sync(this.card(data), {startedAt: event.ts || null});
  }

  // A delegate call (docs/delegation.md): its card nests the child session, which runs it.
  delegateCall(seq, data, event) {
    this.sync(this.card(data), {childSessionId: String(data.childSessionId ?? ''), startedAt: event.ts || null});
  }

  // The child ended: its answer shows before the parent's next run answers the call with it.
  delegateResult(seq, data) {
    const call = this.fold.toolCalls.get(String(data.toolCallId ?? ''));
    this.sync(this.card(data), {childSessionId: call?.childSessionId ?? null, delegated: call?.delegated ?? null});
  }

  // The delegate cards, whose child the chat shows from the session list's picture.
  get delegateCards() {
    return [...this.calls.values()].filter((card) => card.childSessionId);
  }

  toolResult(seq, data, event) {
    this.sync(this.card(data), {result: String(data.content ?? ''), endedAt: event.ts || null});
  }

  approvalRequested(seq, data) {
    this.sync(this.card(data));
  }

  approvalDecided(seq, data) {
    const call = this.card(data);
    this.sync(call, data.approved ? {} : {result: data.reason ? `denied: ${data.reason}` : 'denied'});
    const name = call.name || 'the tool call';
    this.marker(seq, 'quiet', `${data.approved ? 'Approved' : 'Denied'} ${name}`, data.reason ? String(data.reason) : '');
  }

  userQuestion(seq, data) {
    const options = Array.isArray(data.options) ? data.options.map(String) : [];
    this.question = this.push({
      kind: 'question', key: `q${seq}`, seq, question: String(data.question ?? ''), options,
      answered: false, answer: null,
    });
  }

  modelRetry(seq, data) {
    const why = [data.reason, data.message].filter(Boolean).join(': ');
    this.marker(seq, 'warn', `Provider busy, retrying in ${seconds(data.delayMs)} s`,
      `retry ${data.attempt}${why ? ` · ${why}` : ''}`);
  }

  // A model call waiting on a provider budget (docs/budgets.md).
  modelWait(seq, data) {
    const what = {
      concurrency: "a free slot of the provider's concurrent calls",
      rpm: "the provider's requests per minute",
      tpm: "the provider's tokens per minute",
      paused: "the provider's Retry-After",
    }[data.reason] || String(data.reason || 'the provider');
    const until = Number.isInteger(data.untilMs) ? ` until ${new Date(data.untilMs).toLocaleTimeString()}` : '';
    this.marker(seq, 'quiet', `Waiting for ${what}${until}`);
  }

  interrupted(seq, data) {
    const reason = String(data.reason || '');
    const text = reason === 'shutdown' ? 'Worker shutting down: handing the session over' : `Interrupted: ${reason}`;
    this.marker(seq, 'warn', text);
  }

  compactionRequested(seq) {
    this.marker(seq, 'quiet', 'Compaction requested');
  }

  // Where the model's view of the conversation was cut: every event before it stays shown.
  compacted(seq) {
    const compaction = this.fold.compactions.at(-1);
    this.push({kind: 'compaction', key: `c${seq}`, ...compaction});
  }

  sessionEnd(seq, data) {
    const status = String(data.status || '');
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
      else if (this.delegateCards.some((c) => c.status === 'running' && !c.delegated)) text = 'Waiting for its delegated sessions';
      this.marker(seq, 'info', text, data.note ? String(data.note) : '');
    } else if (status === 'failed') {
      const error = this.fold.error || {};
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
  delegate_call: Conversation.prototype.delegateCall,
  delegate_result: Conversation.prototype.delegateResult,
  tool_result: Conversation.prototype.toolResult,
  tool_approval_requested: Conversation.prototype.approvalRequested,
  tool_approval_decided: Conversation.prototype.approvalDecided,
  user_question: Conversation.prototype.userQuestion,
  model_retry: Conversation.prototype.modelRetry,
  model_wait: Conversation.prototype.modelWait,
  session_interrupted: Conversation.prototype.interrupted,
  session_end: Conversation.prototype.sessionEnd,
  compaction_requested: Conversation.prototype.compactionRequested,
  session_compacted: Conversation.prototype.compacted,
};
