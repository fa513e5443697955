// Draws a Conversation (conversation.js) as a chat: messages, tool cards, questions, markers.
// Keyed by item: an item is redrawn only when its `rev` changed, so streaming text grows in place
// and an open result stays open.

import {TOOL_STATES, interruptedLabel} from './conversation.js';
import {h, json} from './dom.js';

export class ChatView {
  // actions: {approve(callId, approved), answer(text), canAct()}
  constructor(root, actions) {
    this.root = root;
    this.actions = actions;
    this.drawn = new Map(); // key -> {rev, el, live}
    this.open = new Set(); // keys of tool cards whose result is unfolded
  }

  reset() {
    this.drawn.clear();
    this.open.clear();
    this.root.replaceChildren();
  }

  render(conversation, {live}) {
    const stick = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 80;
    // `ask_user` shows as its question, with the options to answer it, not as a tool card.
    const items = conversation.view.filter((item) => !(item.kind === 'tool' && item.name === 'ask_user'));
    const keep = new Set(items.map((item) => item.key));
    for (const [key, drawn] of this.drawn) {
      if (!keep.has(key)) { drawn.el.remove(); this.drawn.delete(key); }
    }
    let previous = null;
    for (const item of items) {
      let drawn = this.drawn.get(item.key);
      if (!drawn || drawn.rev !== item.rev || drawn.live !== live) {
        const el = this.item(item, live);
        if (drawn) drawn.el.replaceWith(el);
        drawn = {rev: item.rev, el, live};
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
      case 'user': return userBubble(item);
      case 'assistant': return assistantBubble(item);
      case 'tool': return this.toolCard(item, live);
      case 'question': return this.question(item, live);
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
    if (call.result !== null && call.result !== undefined) {
      const details = h('details', {class: 'tool-result'},
        h('summary', {text: status === 'succeeded' ? 'Result' : 'Details'}),
        h('pre', {text: call.result || '(empty)'}));
      details.open = this.open.has(call.key);
      details.addEventListener('toggle', () => {
        if (details.open) this.open.add(call.key); else this.open.delete(call.key);
      });
      card.append(details);
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

function userBubble(item) {
  return h('div', {class: 'msg user', dataset: {seq: item.seq}},
    h('p', {class: 'who'}, 'You', item.delivery === 'steer' ? h('span', {class: 'tag', text: 'steered'}) : null),
    h('div', {class: 'bubble', text: item.text}));
}

function assistantBubble(item) {
  const tags = [];
  if (item.streaming) tags.push(h('span', {class: 'tag live', text: 'streaming'}));
  if (item.stopReason === 'aborted') tags.push(h('span', {class: 'tag', text: 'stopped'}));
  if (item.stopReason === 'length') tags.push(h('span', {class: 'tag', text: 'cut off at the output limit'}));
  const bubble = h('div', {class: 'bubble', text: item.text});
  if (item.streaming) bubble.append(h('span', {class: 'caret', 'aria-hidden': 'true'}));
  return h('div', {class: `msg assistant${item.streaming ? ' streaming' : ''}`, dataset: {seq: item.seq ?? ''}},
    h('p', {class: 'who'}, 'Agent', tags), bubble);
}

function marker(item) {
  return h('div', {class: `marker marker-${item.tone}`, dataset: {seq: item.seq}, role: 'note'},
    h('span', {class: 'marker-text', text: item.text}),
    item.detail ? h('span', {class: 'marker-detail', text: item.detail}) : null);
}
