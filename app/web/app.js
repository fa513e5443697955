// The workbench: the session list (live from the owner stream), one session's conversation
// (live from its session stream), and the actions that fit its state.

import {api, auth, sessionPath, streamUrl} from './api.js';
import {AssistantNames, AssistantsView, assistantLabel} from './assistants.js';
import {ChatView} from './chat.js';
import {Conversation, SESSION_EVENT_TYPES, TERMINAL, shortWorker} from './conversation.js';
import {CreateForm} from './create.js';
import {$, ago, h, json, show, when} from './dom.js';
import {SessionList} from './sessions.js';
import {EventStream} from './stream.js';

const OWNER_TYPES = ['session_created', 'session_status', 'session_title', 'session_active_stage',
  'session_cancel_requested', 'session_resumed', 'session_deleted'];
const PAGE_SIZE = 50;
// Session events after which the session's details (attempt, lease, usage) have moved on.
const DETAIL_EVENTS = new Set(['user_message', 'session_start', 'session_resumed', 'assistant_message',
  'tool_call_start', 'tool_result', 'tool_approval_requested', 'tool_approval_decided', 'session_end']);

const state = {
  list: new SessionList(),
  owner: null, // the owner EventStream
  generation: 0, // a newer list load makes older answers moot
  loadingMore: false,
  openId: null,
  session: null, // the open session as GET /api/agent/{id} last said
  conversation: new Conversation(),
  stream: null, // the open session's EventStream
  live: false, // the session stream has caught up
  detailsTimer: null,
  deleteArmed: null,
};

const chat = new ChatView($('chat'), {
  approve: (callId, approved) => act(() => api('POST', sessionPath(state.openId, `/tool-calls/${encodeURIComponent(callId)}/approval`), {approved})),
  answer: (text) => act(() => api('POST', sessionPath(state.openId, '/messages'), {text})),
  canAct: () => Boolean(state.openId),
});
const createForm = new CreateForm({onCreated: (session) => {
  state.list.put(session, state.list.lastEventId);
  renderList();
  openSession(session.id);
}});
const assistantNames = new AssistantNames();
const assistantsView = new AssistantsView({names: assistantNames, onStart: (assistant) => {
  $('assistants-dialog').close();
  createForm.show(assistant.id);
}});

// --- problems and connection ------------------------------------------------------------------

function report(error) {
  const problem = $('problem');
  problem.textContent = error ? String(error.message || error) : '';
  show(problem, Boolean(error));
}

async function act(fn) {
  try {
    await fn();
    report(null);
  } catch (error) {
    if (error.status !== 401) report(error);
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

function listPath(list, pageToken) {
  const query = new URLSearchParams({limit: String(PAGE_SIZE)});
  if (list.status) query.append('status', list.status);
  if (list.search.trim()) query.set('q', list.search.trim());
  if (pageToken) query.set('pageToken', pageToken);
  return `/api/agent?${query}`;
}

// A fresh snapshot of the first page, and the owner stream from its cursor.
async function startList() {
  const generation = ++state.generation;
  state.owner?.stop();
  const list = new SessionList({status: $('status-filter').value, search: $('search').value});
  let page;
  try {
    page = await api('GET', listPath(list, null));
  } catch (error) {
    if (generation !== state.generation) return;
    ownerState('closed');
    if (error.status !== 401) {
      report(error);
      setTimeout(() => { if (generation === state.generation) startList(); }, 3000);
    }
    return;
  }
  if (generation !== state.generation) return;
  report(null);
  list.addPage(page);
  state.list = list;
  renderList();
  state.owner = new EventStream({
    url: (cursor) => streamUrl('/api/agent/owner-events', cursor),
    types: OWNER_TYPES,
    cursor: () => state.list.lastEventId,
    onFrame: ownerFrame,
    onState: ownerState,
    onClosed: () => probe('/api/agent?limit=1'),
  });
  state.owner.open();
  fillScreen();
}

async function loadMore() {
  const list = state.list;
  if (state.loadingMore || !list.nextPageToken) return;
  state.loadingMore = true;
  $('more').textContent = 'Loading…';
  try {
    const page = await api('GET', listPath(list, list.nextPageToken));
    if (list === state.list) list.addPage(page);
    report(null);
  } catch (error) {
    if (error.status !== 401) report(error);
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

async function ownerFrame(type, event) {
  if (type === 'caught_up') return;
  if (type === 'resync_required') {
    state.owner.stop();
    startList();
    return;
  }
  const list = state.list;
  const {changed, fetch} = list.apply(event);
  if (changed) renderList();
  if (fetch) {
    try {
      const session = await api('GET', sessionPath(fetch));
      if (list === state.list && list.matches(session) && list.inRange(session)) {
        list.put(session, Number(event.id));
        renderList();
      }
    } catch { /* gone since: nothing to show */ }
  }
  if (event.sessionId === state.openId) {
    if (type === 'session_deleted') closeSession('Session deleted.');
    else scheduleDetails();
  }
}

function renderList() {
  const list = state.list;
  const rows = list.visible();
  const ul = $('sessions');
  ul.replaceChildren(...rows.map((s) => h('li', {
    class: s.id === state.openId ? 'open' : null, dataset: {id: s.id, status: s.status},
  }, h('button', {class: 'row', onclick: () => openSession(s.id), 'aria-current': s.id === state.openId ? 'true' : null},
    h('span', {class: 'row-title', text: s.title}),
    h('span', {class: 'row-meta'},
      h('span', {class: `badge status-${s.status}`, text: s.status}),
      s.resumes > 0 ? h('span', {
        class: 'resumes',
        title: 'Taken over from a worker that crashed, lost its lease or shut down',
        text: s.resumes === 1 ? 'resumed once' : `resumed ${s.resumes}×`,
      }) : null,
      h('time', {datetime: s.createdAt, title: when(s.createdAt), text: ago(s.createdAt)}))))));
  const filtered = Boolean(list.status || list.search.trim());
  $('list-empty').textContent = filtered ? 'No session matches.' : 'No sessions yet. Create one.';
  show($('list-empty'), list.pages > 0 && rows.length === 0 && list.complete);
  show($('more'), Boolean(list.nextPageToken));
  $('more').textContent = 'Load more';
  $('list-count').textContent = list.pages === 0 ? ''
    : list.complete ? `${rows.length} session${rows.length === 1 ? '' : 's'}`
      : `${rows.length} shown · more below`;
}

// --- one session ---------------------------------------------------------------------------

function openSession(id) {
  if (state.openId === id && state.stream) return;
  closeSession();
  state.openId = id;
  if (location.hash !== `#${id}`) history.replaceState(null, '', `#${id}`);
  state.session = state.list.rows.get(id) || null;
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
  state.stream = new EventStream({
    url: (cursor) => streamUrl(sessionPath(id, '/events'), cursor || undefined),
    types: SESSION_EVENT_TYPES,
    cursor: () => state.conversation.cursor,
    onFrame: sessionFrame,
    onState: (value) => { $('stream-state').textContent = value === 'live' ? '' : value; },
    onClosed: () => probe(sessionPath(id)),
  });
  state.stream.open();
  chat.render(state.conversation, {live: false});
}

function closeSession(notice) {
  state.stream?.stop();
  state.stream = null;
  state.openId = null;
  state.session = null;
  clearTimeout(state.detailsTimer);
  show($('session'), false);
  show($('welcome'), true);
  $('welcome-notice').textContent = notice || '';
  if (location.hash) history.replaceState(null, '', location.pathname);
  renderList();
}

function sessionFrame(type, event) {
  const conversation = state.conversation;
  if (type === 'caught_up') {
    state.live = true;
    chat.render(conversation, {live: true});
    renderSession();
    return;
  }
  if (type === 'resync_required') {
    // The log is not where this page left it: read it again from the start.
    state.stream.stop();
    state.conversation = new Conversation();
    chat.reset();
    $('events').replaceChildren();
    state.stream.open();
    return;
  }
  if (!conversation.apply(event)) return;
  chat.render(conversation, {live: state.live});
  if (type !== 'message_delta') {
    appendRawEvent(event);
    if (DETAIL_EVENTS.has(type)) scheduleDetails();
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

// Asks the server why a stream closed: false (stay closed) when the key is refused or the thing
// is gone, true (reopen later) otherwise.
async function probe(path) {
  try {
    await api('GET', path);
    return true;
  } catch (error) {
    if (error.status === 401) return false;
    if (error.status === 404 && path !== '/api/agent?limit=1') {
      closeSession('This session no longer exists.');
      return false;
    }
    return true;
  }
}

function scheduleDetails(delay = 150) {
  clearTimeout(state.detailsTimer);
  const id = state.openId;
  if (!id) return;
  state.detailsTimer = setTimeout(async () => {
    try {
      const session = await api('GET', sessionPath(id));
      if (id !== state.openId) return;
      state.session = session;
      if (state.list.rows.has(id)) state.list.put(session, state.list.lastEventId);
      renderSession();
      renderList();
    } catch (error) {
      if (error.status === 404 && id === state.openId) closeSession('This session no longer exists.');
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
    add('Worker', s.lease
      ? h('span', {title: `${s.lease.workerId} · pid ${s.lease.pid ?? '?'}`, text: `${shortWorker(s.lease.workerId)} · pid ${s.lease.pid ?? '?'}`})
      : (TERMINAL.has(status) || status === 'waiting' ? 'none (not running)' : 'none yet'));
    const usage = s.usage || {};
    add('Usage', `${usage.inputTokens ?? 0} in · ${usage.outputTokens ?? 0} out · ${usage.cachedTokens ?? 0} cached`);
    add('Model', s.model);
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
$('cancel').addEventListener('click', () => act(() => api('POST', sessionPath(state.openId, '/cancel'))));
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
    await api('DELETE', sessionPath(id));
    state.list.rows.delete(id);
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
    await api('POST', sessionPath(id, '/messages'), {text});
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
