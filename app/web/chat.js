// Draws a Conversation (conversation.js) as a chat: messages, tool cards, questions, markers
// and compactions. Keyed by item: an item is redrawn only when its `rev` changed (or it is
// edited), so streaming text grows in place and an open result or summary stays open.

import {TOOL_STATES, interruptedLabel} from './conversation.js';
import {h, json} from './dom.js';

export class ChatView {
  // actions: {approve(callId, approved), answer(text), edit(seq, text), retry(seq), canAct()}
  constructor(root, actions) {
    this.root = root;
    this.actions = actions;
    this.drawn = new Map(); // key -> {rev, el, live, editing}
    this.open = new Set(); // keys of tool cards and compactions unfolded
    this.editing = null; // the key of the user message edited in place
    this.editText = null; // its text so far, kept across redraws
    this.last = null; // what was rendered last: an edit's start or end redraws it
    this.forkPoint = null; // a fork's marker, {seq, text}: drawn after its copied history
  }

  reset() {
    this.forkPoint = null;
    this.last = null; // another conversation's items must never be drawn in the new one's keys
    this.drawn.clear();
    this.open.clear();
    this.editing = null;
    this.editText = null;
    this.root.replaceChildren();
  }

  setEditing(key) {
    this.editing = key;
    this.editText = null;
    if (this.last) this.render(...this.last);
  }

  setForkPoint(point) {
    if (point?.seq === this.forkPoint?.seq && point?.text === this.forkPoint?.text) return;
    this.forkPoint = point;
    if (this.last) this.render(...this.last);
  }

  // A fork's history is its parent's log through `seq` (its seqs kept): the marker goes after
  // the last item of it, or first while the stream has not reached it.
  withForkPoint(items) {
    const point = this.forkPoint;
    if (!point) return items;
    const marker = {kind: 'marker', key: 'fork-point', rev: point.text, seq: point.seq, tone: 'info', text: point.text, detail: ''};
    const at = items.findLastIndex((item) => Number.isInteger(item.seq) && item.seq <= point.seq) + 1;
    return [...items.slice(0, at), marker, ...items.slice(at)];
  }

  render(conversation, {live}) {
    this.last = [conversation, {live}];
    const stick = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 80;
    // `ask_user` shows as its question, with the options to answer it, not as a tool card.
    const items = this.withForkPoint(
      conversation.view.filter((item) => !(item.kind === 'tool' && item.name === 'ask_user')));
    const keep = new Set(items.map((item) => item.key));
    for (const [key, drawn] of this.drawn) {
      if (!keep.has(key)) { drawn.el.remove(); this.drawn.delete(key); }
    }
    let previous = null;
    for (const item of items) {
      let drawn = this.drawn.get(item.key);
      const editing = this.editing === item.key;
      if (!drawn || drawn.rev !== item.rev || drawn.live !== live || drawn.editing !== editing) {
        const el = this.item(item, live);
        if (drawn) drawn.el.replaceWith(el);
        drawn = {rev: item.rev, el, live, editing};
        this.drawn.set(item.key, drawn);
      }
      const want = previous ? previous.nextSibling : this.root.firstChild;
      if (want !== drawn.el) this.root.insertBefore(drawn.el, want);
      previous = drawn.el;
    }
    if (!items.length) this.root.replaceChildren(h('p', {class: 'empty', text: 'Nothing yet.'}));
    else this.root.querySelector(':scope > p.empty')?.remove();
    if (stick) this.root.scrollTop = this.root.scrollHeight;
  }

  item(item, live) {
    switch (item.kind) {
      case 'user': return this.editing === item.key ? this.editor(item) : this.userBubble(item, live);
      case 'assistant': return this.assistantBubble(item, live);
      case 'tool': return this.toolCard(item, live);
      case 'question': return this.question(item, live);
      case 'compaction': return this.compaction(item);
      default: return marker(item);
    }
  }

  toolCard(call, live) {
    const status = call.status;
    const label = status === 'interrupted' ? interruptedLabel(call.cause) : TOOL_STATES[status] || status;
    const args = json(call.arguments);
    const duration = call.startedAt && call.endedAt
      ? `${((Date.parse(call.endedAt) - Date.parse(call.startedAt)) / 1000).toFixed(1)} s` : '';
    const card = h('article', {class: `tool tool-${status}`, dataset: {callId: call.id, status}},
      h('header', {},
        h('span', {class: 'tool-icon', 'aria-hidden': 'true', text: '⚙'}),
        h('span', {class: 'tool-name', text: call.name || 'tool'}),
        h('span', {class: `tool-state state-${status}`, text: label}),
        duration ? h('span', {class: 'tool-time', text: duration}) : null),
      h('code', {class: 'tool-args', title: args, text: args}));
    if (call.childSessionId) card.append(delegateBox(call));
    if (call.result !== null && call.result !== undefined) {
      card.append(this.folded(call.key, {class: 'tool-result'},
        h('summary', {text: status === 'succeeded' ? 'Result' : 'Details'}),
        h('pre', {text: call.result || '(empty)'})));
    }
    if (status === 'awaiting_approval') {
      const enabled = live && this.actions.canAct();
      card.append(h('div', {class: 'actions'},
        h('span', {class: 'hint', text: 'This call waits for your approval.'}),
        h('button', {class: 'primary', disabled: !enabled, onclick: () => this.actions.approve(call.id, true), text: 'Approve'}),
        h('button', {class: 'danger', disabled: !enabled, onclick: () => this.actions.approve(call.id, false), text: 'Deny'})));
    }
    return card;
  }

  // A <details> that stays open or closed across redraws.
  folded(key, attrs, ...children) {
    const details = h('details', attrs, ...children);
    details.open = this.open.has(key);
    details.addEventListener('toggle', () => {
      if (details.open) this.open.add(key); else this.open.delete(key);
    });
    return details;
  }

  // The model sees the summary instead of the events through `throughSeq`; the chat keeps them.
  compaction(item) {
    const tokens = `${item.tokensBefore} → ${item.tokensAfter} tokens · ${item.model}`;
    return this.folded(item.key, {class: 'compaction', role: 'note', dataset: {seq: item.seq, throughSeq: item.throughSeq}},
      h('summary', {},
        h('span', {class: 'compaction-text', text: `Compacted: the model sees a summary of #1–#${item.throughSeq}`}),
        h('span', {class: 'compaction-detail', text: tokens})),
      h('pre', {class: 'compaction-summary', text: item.summary}));
  }

  // Fork and edit (docs/fork.md): a new session, this one's log up to the message.
  userBubble(item, live) {
    const enabled = live && this.actions.canAct();
    return h('div', {class: 'msg user', dataset: {seq: item.seq}},
      h('p', {class: 'who'}, 'You', item.delivery === 'steer' ? h('span', {class: 'tag', text: 'steered'}) : null),
      h('div', {class: 'bubble', text: item.text}),
      h('div', {class: 'msg-actions'},
        h('button', {class: 'link edit', type: 'button', disabled: !enabled, onclick: () => this.setEditing(item.key),
          title: 'Fork the session here with this message changed, and have it answered', text: 'Edit'})));
  }

  editor(item) {
    const text = h('textarea', {class: 'edit-text', rows: 3, 'aria-label': 'The edited message'});
    text.value = this.editText ?? item.text;
    text.addEventListener('input', () => { this.editText = text.value; });
    const form = h('form', {class: 'msg user editing', dataset: {seq: item.seq}},
      h('p', {class: 'who', text: `You · edit #${item.seq}: answered in a new session (a fork); this one stays`}),
      text,
      h('div', {class: 'msg-actions'},
        h('button', {class: 'ghost', type: 'button', onclick: () => this.setEditing(null), text: 'Cancel'}),
        h('button', {class: 'primary', type: 'submit', text: 'Fork with this message'})));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      if (text.value.trim()) this.actions.edit(item.seq, text.value);
    });
    text.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') this.setEditing(null);
      if (event.key === 'Enter' && (event.metaKey || event.ctrlKey)) form.requestSubmit();
    });
    requestAnimationFrame(() => text.focus());
    return form;
  }

  assistantBubble(item, live) {
    const tags = [];
    if (item.streaming) tags.push(h('span', {class: 'tag live', text: 'streaming'}));
    if (item.stopReason === 'aborted') tags.push(h('span', {class: 'tag', text: 'stopped'}));
    if (item.stopReason === 'length') tags.push(h('span', {class: 'tag', text: 'cut off at the output limit'}));
    const bubble = h('div', {class: 'bubble', text: item.text});
    if (item.streaming) bubble.append(h('span', {class: 'caret', 'aria-hidden': 'true'}));
    // A retry forks at the user message this answers, which the fork answers again.
    const retry = !item.streaming && item.userSeq ? h('div', {class: 'msg-actions'},
      h('button', {class: 'link retry', type: 'button', disabled: !(live && this.actions.canAct()),
        onclick: () => this.actions.retry(item.userSeq),
        title: `Fork the session at your message #${item.userSeq} and have it answered again`,
        text: 'Retry from here'})) : null;
    return h('div', {class: `msg assistant${item.streaming ? ' streaming' : ''}`, dataset: {seq: item.seq ?? ''}},
      h('p', {class: 'who'}, 'Agent', tags), bubble, retry);
  }

  question(item, live) {
    const box = h('article', {class: 'question', dataset: {seq: item.seq}},
      h('p', {class: 'who', text: 'The agent asks'}),
      h('p', {class: 'question-text', text: item.question}));
    if (item.answered) {
      box.classList.add('answered');
      box.append(h('p', {class: 'hint', text: 'Answered.'}));
    } else if (item.options.length) {
      const enabled = live && this.actions.canAct();
      box.append(h('div', {class: 'options'}, item.options.map((option) => h('button', {
        class: 'option', disabled: !enabled, onclick: () => this.actions.answer(option), text: option,
      }))));
    } else {
      box.append(h('p', {class: 'hint', text: 'Answer with a message below.'}));
    }
    return box;
  }
}

// A delegate call's child session, nested in its card: a link that opens it, its status live
// (the list's picture; its end as the parent's log says once it came), then its answer.
function delegateBox(call) {
  const id = call.childSessionId;
  const ended = call.delegated;
  const status = ended?.status || call.child?.status || 'queued';
  const error = ended?.error;
  return h('div', {class: 'delegate', dataset: {childId: id, childStatus: status}},
    h('p', {class: 'delegate-head'},
      h('a', {class: 'delegate-link', href: `#${id}`, title: id, text: call.child?.title || `session ${id.slice(0, 8)}`}),
      h('span', {class: `badge delegate-status status-${status}`, text: status})),
    status === 'waiting' && !ended
      ? h('p', {class: 'hint delegate-waiting', text: 'The delegated session waits for a person: open it to answer.'}) : null,
    ended?.answer ? h('div', {class: 'delegate-answer', text: ended.answer}) : null,
    error ? h('p', {class: 'error-text delegate-error', text: `${error.code ?? 'error'}: ${error.message ?? ''}`}) : null);
}

function marker(item) {
  return h('div', {class: `marker marker-${item.tone}`, dataset: {seq: item.seq}, role: 'note'},
    h('span', {class: 'marker-text', text: item.text}),
    item.detail ? h('span', {class: 'marker-detail', text: item.detail}) : null);
}
