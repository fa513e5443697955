// The workbench: the session list (live from the owner stream), one session's conversation
// (live from its session stream), and the actions that fit its state. Every call, stream and
// the list's picture are @ferryman/client's (ferryman-client.js).

import {auth, call, ferryman, problemText, unauthorized} from './api.js';
import {AssistantNames, AssistantsView, assistantLabel} from './assistants.js';
import {ChatView} from './chat.js';
import {Conversation, TERMINAL, shortWorker} from './conversation.js';
import {CreateForm} from './create.js';
import {$, ago, h, json, show, when} from './dom.js';
import {AuthenticationError, NotFoundError, OwnerSessionClient} from './ferryman-client.js';

const PAGE_SIZE = 50;
// What POST /compact takes (docs/compaction.md): idle, failed and cancelled sessions are 409.
const COMPACTABLE = new Set(['queued', 'running', 'waiting', 'succeeded']);
// Session events after which the session's details (attempt, lease, usage) have moved on.
const DETAIL_EVENTS = new Set(['user_message', 'session_start', 'session_resumed', 'assistant_message',
  'tool_call_start', 'tool_result', 'tool_approval_requested', 'tool_approval_decided', 'session_end',
  'session_compacted', 'delegate_call', 'delegate_result']);

const state = {
  owner: null, // the list's OwnerSessionClient, its range the filters
  everLive: false, // the owner stream has caught up once (else it is still connecting)
  seen: null, // the owner journal's last entry this page has acted on
  generation: 0, // a newer list load makes older answers moot
  loadingMore: false,
  openId: null,
  session: null, // the open session as GET /api/agent/{id} last said
  conversation: new Conversation(),
  follow: null, // the AbortController of the open session's stream
  live: false, // the session stream has caught up
  detailsTimer: null,
  deleteArmed: null,
  children: new Map(), // child sessions outside the list's range, as last read, by id
};

const chat = new ChatView($('chat'), {
  approve: (callId, approved) => act(() => call((f) => f.decideToolCall(state.openId, callId, approved))),
  answer: (text) => act(() => call((f) => f.sendMessage(state.openId, text))),
  edit: (seq, text) => fork({atSeq: seq, message: text}),
  retry: (seq) => fork({atSeq: seq}),
  canAct: () => Boolean(state.openId),
});
const createForm = new CreateForm({onCreated: (session) => openSession(session.id, session)});
const assistantNames = new AssistantNames();
const assistantsView = new AssistantsView({names: assistantNames, onStart: (assistant) => {
  $('assistants-dialog').close();
  createForm.show(assistant.id);
}});

// Edit and retry (docs/fork.md): a new session from the open one's log, opened at once.
function fork(body) {
  const id = state.openId;
  act(async () => {
    const forked = await call((f) => f.forkSession(id, body));
    if (state.openId === id) openSession(forked.id, forked);
  });
}

// --- problems and connection ------------------------------------------------------------------

function report(error) {
  const problem = $('problem');
  problem.textContent = error ? problemText(error) : '';
  show(problem, Boolean(error));
}

async function act(fn) {
  try {
    await fn();
    report(null);
  } catch (error) {
    if (!(error instanceof AuthenticationError)) report(error);
  }
  scheduleDetails(0);
}

function setConnection(text, tone) {
  const conn = $('conn');
  conn.textContent = text;
  conn.dataset.state = tone;
}

function ownerState(value) {
  const words = {connecting: 'connecting…', live: 'live', reconnecting: 'reconnecting…', closed: 'disconnected'};
  setConnection(words[value] || value, value);
}

// --- keys ---------------------------------------------------------------------------------------

function askForKey(reason) {
  const dialog = $('key-dialog');
  $('key-reason').textContent = reason;
  $('key-input').value = '';
  if (!dialog.open) dialog.showModal();
  $('key-input').focus();
}

auth.onUnauthorized = () => askForKey(auth.key
  ? 'The server refused this key. Paste another one.'
  : 'This server wants an API key. Create one with `ferryman keys create --owner NAME`.');

$('key-form').addEventListener('submit', (event) => {
  event.preventDefault();
  auth.set($('key-input').value.trim());
  $('key-dialog').close();
  renderKey();
  restartAll();
});
$('key-forget').addEventListener('click', () => {
  auth.set('');
  $('key-dialog').close();
  renderKey();
  restartAll();
});
$('key-button').addEventListener('click', () => askForKey(auth.key
  ? 'This tab uses a key. Paste another one, or forget it.'
  : 'In local mode no key is needed. A server in keys mode asks for one.'));

function renderKey() {
  $('key-button').textContent = auth.key ? `Key …${auth.key.slice(-4)}` : 'API key';
}

// --- the list -----------------------------------------------------------------------------------

// A fresh picture of the filters' range: its first page, then the owner stream from its
// cursor (the package reconnects, reconciles, and takes a new snapshot on resync_required).
async function startList() {
  const generation = ++state.generation;
  state.owner?.close();
  const status = $('status-filter').value;
  const range = {status: status ? [status] : [], q: $('search').value, pageSize: PAGE_SIZE};
  const owner = new OwnerSessionClient(ferryman(), {range, onChange: () => ownerChanged(owner)});
  ownerState('connecting');
  try {
    await owner.start();
  } catch (error) {
    if (generation !== state.generation) return;
    ownerState('closed');
    if (!unauthorized(error)) {
      report(error);
      setTimeout(() => { if (generation === state.generation) startList(); }, 3000);
    }
    return;
  }
  if (generation !== state.generation) {
    owner.close();
    return;
  }
  report(null);
  Object.assign(state, {owner, everLive: false, seen: null});
  renderList();
  fillScreen();
}

async function loadMore() {
  const owner = state.owner;
  if (state.loadingMore || !owner || owner.complete) return;
  state.loadingMore = true;
  $('more').textContent = 'Loading…';
  try {
    await owner.loadMore();
    report(null);
  } catch (error) {
    if (!unauthorized(error)) report(error);
  } finally {
    state.loadingMore = false;
    renderList();
  }
  fillScreen();
}

// Loads pages while the end of the list is in view (a tall screen, or a scroll to the bottom).
function fillScreen() {
  const more = $('more');
  if (more.hidden) return;
  const box = $('sessions-scroll').getBoundingClientRect();
  const at = more.getBoundingClientRect();
  if (at.top < box.bottom + 200) loadMore();
}

function ownerChanged(owner) {
  if (owner !== state.owner) return;
  if (owner.error) {
    // Stopped for good (a revoked key, say): a new picture, once there is a way to one.
    ownerState('closed');
    state.owner = null;
    if (!unauthorized(owner.error)) {
      report(owner.error);
      setTimeout(() => { if (!state.owner) startList(); }, 3000);
    }
    return;
  }
  state.everLive ||= owner.connected;
  ownerState(owner.connected ? 'live' : state.everLive ? 'reconnecting' : 'connecting');
  for (const entry of newEntries(owner.journal)) {
    // A child outside the list's range is read again when it moves.
    if (state.children.has(entry.sessionId) && !owner.sessions.has(entry.sessionId)) readChild(entry.sessionId);
    if (entry.sessionId !== state.openId || !['applied', 'outside'].includes(entry.outcome)) continue;
    if (entry.type === 'session_deleted') closeSession('Session deleted.');
    else scheduleDetails();
  }
  renderList();
  renderChildren();
}

// --- delegated sessions -------------------------------------------------------------------------

// A child session as the list's picture has it, or as last read when it is outside the range.
function childSession(id) {
  const shown = state.owner?.sessions.get(id);
  if (shown) return shown;
  if (!state.children.has(id)) readChild(id);
  return state.children.get(id) || null;
}

function readChild(id) {
  if (!state.children.has(id)) state.children.set(id, null);
  call((f) => f.getSession(id)).then((child) => {
    state.children.set(id, child);
    renderChildren();
  }, () => {});
}

// Redraws the delegate cards whose child moved on (its status, its title) since drawn.
function renderChildren() {
  let changed = false;
  for (const card of state.conversation.delegateCards) {
    const child = childSession(card.childSessionId);
    const seen = child ? {title: child.title, status: child.status} : null;
    if (seen?.title === card.child?.title && seen?.status === card.child?.status) continue;
    state.conversation.touch(card, {child: seen});
    changed = true;
  }
  if (changed) chat.render(state.conversation, {live: state.live});
}

// The journal's entries since the last one this page acted on (the journal drops old ones).
function newEntries(journal) {
  let start = journal.length;
  while (start > 0 && journal[start - 1] !== state.seen) start -= 1;
  state.seen = journal.at(-1) ?? state.seen;
  return journal.slice(start);
}

// Each session with its depth, a child right under its parent (oldest child first); a child
// whose parent is not in the picture stands on its own.
function withChildren(sessions) {
  const ids = new Set(sessions.map((s) => s.id));
  const under = new Map();
  for (const s of sessions) {
    const parent = s.parent?.sessionId;
    if (parent && ids.has(parent) && parent !== s.id) under.set(parent, [...(under.get(parent) || []), s]);
  }
  const rows = [];
  const placed = new Set();
  const place = (s, depth) => {
    if (placed.has(s.id)) return;
    placed.add(s.id);
    rows.push({session: s, depth});
    for (const child of (under.get(s.id) || []).reverse()) place(child, depth + 1);
  };
  for (const s of sessions) if (!s.parent || !ids.has(s.parent.sessionId)) place(s, 0);
  for (const s of sessions) place(s, 0); // a cycle's members, which the API never makes
  return rows;
}

// Newest first, as the server pages: by creation time, then id.
function newestFirst(a, b) {
  if (a.createdAt !== b.createdAt) return a.createdAt < b.createdAt ? 1 : -1;
  return a.id < b.id ? 1 : -1;
}

function renderList() {
  const owner = state.owner;
  const rows = owner ? withChildren([...owner.sessions.values()].sort(newestFirst)) : [];
  const ul = $('sessions');
  ul.replaceChildren(...rows.map(({session: s, depth}) => h('li', {
    class: [s.id === state.openId ? 'open' : '', depth ? 'child' : ''].join(' ').trim() || null,
    dataset: {id: s.id, status: s.status, depth},
  }, h('button', {class: 'row', onclick: () => openSession(s.id), 'aria-current': s.id === state.openId ? 'true' : null},
    h('span', {class: 'row-title', text: s.title}),
    h('span', {class: 'row-meta'},
      h('span', {class: `badge status-${s.status}`, text: s.status}),
      s.forkedFrom ? h('span', {class: 'tag fork', title: `Forked at #${s.forkedFrom.seq}`, text: 'fork'}) : null,
      s.parent ? h('span', {class: 'tag delegated', title: `Delegated by ${owner.sessions.get(s.parent.sessionId)?.title ?? s.parent.sessionId}`, text: 'delegated'}) : null,
      s.resumes > 0 ? h('span', {
        class: 'resumes',
        title: 'Taken over from a worker that crashed, lost its lease or shut down',
        text: s.resumes === 1 ? 'resumed once' : `resumed ${s.resumes}×`,
      }) : null,
      h('time', {datetime: s.createdAt, title: when(s.createdAt), text: ago(s.createdAt)}))))));
  const filtered = Boolean(owner && (owner.range.status.length || owner.range.q));
  $('list-empty').textContent = filtered ? 'No session matches.' : 'No sessions yet. Create one.';
  show($('list-empty'), Boolean(owner) && rows.length === 0 && owner.complete);
  show($('more'), Boolean(owner) && !owner.complete);
  $('more').textContent = 'Load more';
  $('list-count').textContent = !owner ? ''
    : owner.complete ? `${rows.length} session${rows.length === 1 ? '' : 's'}`
      : `${rows.length} shown · more below`;
}
// --- one session ---------------------------------------------------------------------------

function openSession(id, session = null) {
  if (state.openId === id && state.follow) return;
  closeSession();
  state.openId = id;
  if (location.hash !== `#${id}`) history.replaceState(null, '', `#${id}`);
  state.session = session || state.owner?.sessions.get(id) || null;
  state.conversation = new Conversation();
  state.live = false;
  chat.reset();
  $('events').replaceChildren();
  showTab('chat');
  show($('welcome'), false);
  show($('session'), true);
  renderList();
  renderSession();
  scheduleDetails(0);
  const follow = new AbortController();
  state.follow = follow;
  followSession(id, follow);
  chat.render(state.conversation, {live: false});
}

function closeSession(notice) {
  state.follow?.abort();
  state.follow = null;
  state.openId = null;
  state.session = null;
  clearTimeout(state.detailsTimer);
  show($('session'), false);
  show($('welcome'), true);
  $('welcome-notice').textContent = notice || '';
  if (location.hash) history.replaceState(null, '', location.pathname);
  renderList();
}

function streamState(value) {
  $('stream-state').textContent = value === 'live' ? '' : value;
}

// The session stream from where the fold is, across reconnects (the package's), until the
// session is closed here or deleted; after a resync_required, again from the start.
async function followSession(id, follow) {
  const {signal} = follow;
  for (;;) {
    let resync = false;
    streamState('connecting');
    try {
      const after = state.conversation.cursor || null;
      const onConnection = (connected) => { if (!connected) streamState('reconnecting'); };
      for await (const event of ferryman().sessionEvents(id, {after, signal, onConnection})) {
        if (event.type === 'resync_required') resync = true;
        else sessionFrame(event);
      }
    } catch (error) {
      if (signal.aborted) return;
      streamState('closed');
      if (error instanceof NotFoundError) closeSession('This session no longer exists.');
      else if (!unauthorized(error)) report(error);
      return;
    }
    if (signal.aborted) return;
    if (!resync) break; // the stream ends when the session is deleted
    // The log is not where this page left it: read it again from the start.
    state.conversation = new Conversation();
    state.live = false;
    chat.reset();
    $('events').replaceChildren();
  }
  if (state.follow === follow) closeSession('Session deleted.');
}

function sessionFrame(event) {
  const conversation = state.conversation;
  if (event.type === 'caught_up') {
    state.live = true;
    streamState('live');
    chat.render(conversation, {live: true});
    renderSession();
    return;
  }
  if (!conversation.apply(event.envelope)) return;
  if (event.type === 'delegate_call') renderChildren();
  chat.render(conversation, {live: state.live});
  if (event.type !== 'message_delta') {
    appendRawEvent(event.envelope);
    if (DETAIL_EVENTS.has(event.type)) scheduleDetails();
    renderSession();
  }
}

function appendRawEvent(event) {
  $('events').append(h('li', {dataset: {seq: event.seq, type: event.type}},
    h('span', {class: 'ev-seq', text: `#${event.seq}`}),
    h('span', {class: 'ev-type', text: event.type}),
    h('span', {class: 'ev-time', text: event.ts ? new Date(event.ts).toLocaleTimeString() : ''}),
    h('code', {class: 'ev-data', text: json(event.data)})));
}

function scheduleDetails(delay = 150) {
  clearTimeout(state.detailsTimer);
  const id = state.openId;
  if (!id) return;
  state.detailsTimer = setTimeout(async () => {
    try {
      const session = await call((f) => f.getSession(id));
      if (id !== state.openId) return;
      state.session = session;
      renderSession();
    } catch (error) {
      if (error instanceof NotFoundError && id === state.openId) closeSession('This session no longer exists.');
    }
  }, delay);
}
function renderSession() {
  const s = state.session;
  const conversation = state.conversation;
  // The session as last read (each event that moves it schedules a read); before the first
  // read, what its log says.
  const status = s?.status || conversation.status || 'queued';
  $('title').textContent = s?.title || 'Session';
  const badge = $('status');
  badge.textContent = status;
  badge.className = `badge status-${status}`;
  $('stage').textContent = s?.activeStage && status === 'running' ? `· ${s.activeStage}` : '';
  renderLineage(s);
  renderDelegatedBy(s);
  renderDetails(s, status);
  renderActions(s, status);
}

function renderDetails(s, status) {
  const rows = [];
  const add = (label, ...value) => rows.push(h('div', {}, h('dt', {text: label}), h('dd', {}, ...value)));
  if (s) {
    // Runs, and the takeovers among them: follow-ups and approvals are runs, not resumes.
    add('Attempt', String(s.attempt), s.resumes > 0
      ? h('span', {class: 'resumes', text: ` · resumed ${s.resumes}× after a crash or shutdown`}) : null);
    if (s.waitingFor) add('Waiting', h('span', {class: 'waiting', text: waitingText(s.waitingFor)}));
    add('Worker', s.lease
      ? h('span', {title: `${s.lease.workerId} · pid ${s.lease.pid ?? '?'}`, text: `${shortWorker(s.lease.workerId)} · pid ${s.lease.pid ?? '?'}`})
      : (TERMINAL.has(status) || status === 'waiting' ? 'none (not running)' : 'none yet'));
    const usage = s.usage || {};
    add('Usage', `${usage.inputTokens ?? 0} in · ${usage.outputTokens ?? 0} out · ${usage.cachedTokens ?? 0} cached`);
    add('Model', s.model);
    if (s.compaction) add('Compaction', compactionText(s.compaction));
    if (s.assistant) add('Assistant', assistantButton(s.assistant));
    add('Created', h('time', {datetime: s.createdAt, text: when(s.createdAt)}));
    add('Updated', h('time', {datetime: s.updatedAt, text: when(s.updatedAt)}));
    if (s.error) add('Error', h('span', {class: 'error-text', text: `${s.error.code}: ${s.error.message}`}));
    const settings = Object.keys(s.modelSettings || {}).length ? json(s.modelSettings) : '';
    if (s.instructions || settings || (s.approvalRequired || []).length) {
      add('Agent', h('details', {},
        h('summary', {text: 'instructions and settings'}),
        s.instructions ? h('pre', {text: s.instructions}) : null,
        settings ? h('pre', {text: `modelSettings ${settings}`}) : null,
        s.approvalRequired?.length ? h('pre', {text: `approvalRequired ${s.approvalRequired.join(', ')}`}) : null));
    }
    add('Id', h('code', {text: s.id}));
  }
  $('details').replaceChildren(...rows);
}

// Why a queued session is not claimed yet (docs/tenants.md), in a person's words.
function waitingText(w) {
  if (w.reason === 'ownerRunningLimit') {
    return `its owner has ${w.running} of ${w.limit} sessions running (FERRYMAN_OWNER_MAX_RUNNING); it starts when one ends`;
  }
  return w.reason;
}

// When the session's conversation is summarized (docs/compaction.md), in a person's words.
function compactionText(c) {
  const kept = c.keepRecentTurns ?? 2;
  return `past ${c.triggerTokens} tokens · keeps the last ${kept} turn${kept === 1 ? '' : 's'}`
    + (c.model ? ` · by ${c.model}` : '');
}

// The titles of sessions forked or delegated from (by id): null while asked, '' for one that
// is gone.
const parentTitles = new Map();

// A session's title: the list's, or read once (then `loaded` redraws).
function titleOf(id, loaded) {
  const title = state.owner?.sessions.get(id)?.title ?? parentTitles.get(id);
  if (title === undefined) {
    parentTitles.set(id, null);
    call((f) => f.getSession(id)).then(
      (parent) => parentTitles.set(id, parent.title),
      (error) => { if (error instanceof NotFoundError) parentTitles.set(id, ''); },
    ).finally(loaded);
  }
  return title;
}

// A child session (docs/delegation.md) links back to the parent whose tool call made it.
function renderDelegatedBy(s) {
  const box = $('delegated-by');
  const parent = s?.parent;
  show(box, Boolean(parent));
  if (!parent) return box.replaceChildren();
  const parentId = parent.sessionId;
  const title = titleOf(parentId, () => {
    if (state.session?.parent?.sessionId === parentId) renderDelegatedBy(state.session);
  });
  const callText = ` (call …${parent.toolCallId.slice(-8)})`;
  box.replaceChildren(title === ''
    ? `delegated by a deleted session${callText}`
    : h('a', {href: `#${parentId}`, id: 'delegated-by-link', title: `${parentId} · call ${parent.toolCallId}`},
      `delegated by ${title || parentId.slice(0, 8)}${callText}`));
}

// A fork says where it came from: a link to the parent, at the seq it was forked at.
function renderLineage(s) {
  const box = $('forked-from');
  const from = s?.forkedFrom;
  show(box, Boolean(from));
  if (!from) {
    chat.setForkPoint(null);
    return box.replaceChildren();
  }
  const parentId = from.sessionId;
  const title = titleOf(parentId, () => {
    if (state.session?.forkedFrom?.sessionId === parentId) renderLineage(state.session);
  });
  const at = ` at #${from.seq}`;
  const name = title || parentId.slice(0, 8);
  box.replaceChildren(title === ''
    ? `forked from a deleted session${at}`
    : h('a', {href: `#${parentId}`, id: 'forked-from-link', title: parentId}, `forked from ${name}${at}`));
  const text = `Forked from ${title === '' ? 'a deleted session' : name}${at}: what follows is this session's own`;
  chat.setForkPoint({seq: from.seq, text});
}

// The assistant a session was created from, and the version it keeps: opens it.
function assistantButton(ref) {
  const button = h('button', {
    class: 'link', type: 'button', id: 'session-assistant', text: assistantLabel(ref, undefined),
    onclick: () => assistantsView.show(ref.id),
  });
  assistantNames.get(ref.id).then((assistant) => { button.textContent = assistantLabel(ref, assistant); });
  return button;
}

function renderActions(s, status) {
  const terminal = TERMINAL.has(status);
  const cancel = $('cancel');
  show(cancel, !terminal);
  show($('compact'), COMPACTABLE.has(status));
  cancel.disabled = Boolean(s?.cancelRequested);
  cancel.textContent = s?.cancelRequested ? 'Cancelling…' : 'Cancel';
  const send = $('send');
  const pending = state.conversation.pendingApprovals;
  if (pending.length) {
    send.textContent = 'Deny & send';
    $('send-hint').textContent = `A message denies ${approvalsWaiting(pending)}: approve or deny `
      + 'each above to decide it yourself.';
  } else if (status === 'running') {
    send.textContent = 'Steer';
    $('send-hint').textContent = 'The agent reads it at its next turn.';
  } else if (status === 'idle') {
    send.textContent = 'Send';
    $('send-hint').textContent = 'Starts the session: its first message is its prompt.';
  } else if (status === 'queued') {
    send.textContent = 'Send';
    $('send-hint').textContent = 'Queued with the session: the agent reads it when it starts.';
  } else {
    send.textContent = 'Send & re-queue';
    $('send-hint').textContent = status === 'waiting'
      ? 'Answers the agent and puts the session back in the queue.'
      : 'Re-queues the finished session with this message.';
  }
}

function showTab(tab) {
  const events = tab === 'events';
  show($('chat'), !events);
  show($('events'), events);
  $('tab-chat').setAttribute('aria-selected', String(!events));
  $('tab-events').setAttribute('aria-selected', String(events));
}

// --- wiring ---------------------------------------------------------------------------------

function restartAll() {
  startList();
  if (state.openId) {
    const id = state.openId;
    state.openId = null;
    openSession(id);
  }
}

$('tab-chat').addEventListener('click', () => showTab('chat'));
$('tab-events').addEventListener('click', () => showTab('events'));
$('new-session').addEventListener('click', () => createForm.show());
$('assistants-button').addEventListener('click', () => assistantsView.show());
$('welcome-create').addEventListener('click', () => createForm.show());
$('more').addEventListener('click', loadMore);
$('sessions-scroll').addEventListener('scroll', fillScreen, {passive: true});
$('status-filter').addEventListener('change', startList);
let searchTimer = null;
$('search').addEventListener('input', () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(startList, 250);
});
// The picture's cancel: a session that ended before the cancel came is no error (409).
$('cancel').addEventListener('click', () => {
  const id = state.openId;
  act(() => call((f) => (state.owner ? state.owner.cancel(id) : f.cancelSession(id))));
});
$('compact').addEventListener('click', () => {
  const id = state.openId;
  act(() => call((f) => f.compactSession(id)));
});
$('delete').addEventListener('click', () => {
  const button = $('delete');
  if (state.deleteArmed !== state.openId) {
    // Asks once: the first click arms it for a few seconds, the second deletes.
    state.deleteArmed = state.openId;
    button.textContent = 'Delete for good?';
    button.classList.add('armed');
    setTimeout(() => {
      state.deleteArmed = null;
      button.textContent = 'Delete';
      button.classList.remove('armed');
    }, 4000);
    return;
  }
  const id = state.openId;
  state.deleteArmed = null;
  button.textContent = 'Delete';
  button.classList.remove('armed');
  act(async () => {
    await call((f) => f.deleteSession(id));
    if (state.openId === id) closeSession('Session deleted.');
  });
});
function approvalsWaiting(calls) {
  const names = [...new Set(calls.map((c) => c.name || 'tool'))].join(', ');
  return calls.length === 1 ? `the call of ${names} that waits for approval`
    : `the ${calls.length} calls that wait for approval (${names})`;
}

function sendMessage(text) {
  const id = state.openId;
  act(async () => {
    await call((f) => f.sendMessage(id, text));
    if (state.openId === id) $('text').value = '';
  });
}

// A message to a session that waits for approvals denies them (the API's rule): asked first,
// in a dialog of the page.
let denyConfirmed = null;
$('deny-send').addEventListener('click', () => $('deny-dialog').close('send'));
$('deny-keep').addEventListener('click', () => $('deny-dialog').close(''));
$('deny-dialog').addEventListener('close', () => {
  const confirmed = denyConfirmed;
  denyConfirmed = null;
  if (confirmed && $('deny-dialog').returnValue === 'send') confirmed();
});

$('composer').addEventListener('submit', (event) => {
  event.preventDefault();
  const text = $('text').value;
  if (!text.trim()) return;
  const pending = state.conversation.pendingApprovals;
  if (!pending.length) {
    sendMessage(text);
    return;
  }
  $('deny-text').textContent = `Sending this message denies ${approvalsWaiting(pending)}; `
    + 'the agent reads the message and that the calls were not made.';
  denyConfirmed = () => sendMessage(text);
  $('deny-dialog').returnValue = '';
  $('deny-dialog').showModal();
  $('deny-keep').focus();
});
$('text').addEventListener('keydown', (event) => {
  if (event.key === 'Enter' && (event.metaKey || event.ctrlKey)) $('composer').requestSubmit();
});
window.addEventListener('hashchange', () => {
  const id = location.hash.slice(1);
  if (id && id !== state.openId) openSession(id);
});
setInterval(renderList, 30000);

renderKey();
startList();
if (location.hash.length > 1) openSession(location.hash.slice(1));
