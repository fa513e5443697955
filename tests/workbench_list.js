// Run in the page by tests/test_workbench.py: the list fold of sessions.js fed pages and events.
async () => {
  const {SessionList} = await import('/assets/sessions.js');
  const row = (id, createdAt, status = 'queued', title = id) =>
    ({id, createdAt, status, title, attempt: 1, updatedAt: createdAt});
  const list = new SessionList();
  const first = [row("b", "2026-01-02"), row("a", "2026-01-01")];
  list.addPage({cursor: "5", nextPageToken: "t1", sessions: first});
  const ev = (id, type, sessionId, data = {}) => ({id: String(id), type, sessionId, data, ts: '2026-02-01'});
  const stale = list.apply(ev(4, 'session_status', 'b', {status: 'running', attempt: 1})).changed;
  const fresh = list.apply(ev(6, 'session_status', 'b', {status: 'running', attempt: 1})).changed;
  // A later page is a newer snapshot: events older than it never take its rows back in time.
  list.addPage({cursor: '9', nextPageToken: null, sessions: [row('z', '2025-12-31', 'succeeded')]});
  const old = list.apply(ev(7, 'session_status', 'z', {status: 'running', attempt: 1})).changed;
  const zAfterOld = list.rows.get('z').status;
  list.apply(ev(10, 'session_created', 'c', {session: row('c', '2026-01-03')}));
  const replay = list.apply(ev(10, 'session_created', 'c', {session: row('c', '2026-01-03')})).changed;
  list.apply(ev(11, 'session_deleted', 'a'));
  const filtered = new SessionList({status: 'running'});
  filtered.addPage({cursor: '0', nextPageToken: null, sessions: []});
  const fetch = filtered.apply(ev(1, 'session_status', 'q', {status: 'running', attempt: 1})).fetch;
  // A claim says the session's takeovers; a run's end (no `resumes`) leaves them.
  list.apply(ev(12, 'session_status', 'b', {status: 'running', attempt: 2, resumes: 1}));
  list.apply(ev(13, 'session_status', 'b', {status: 'succeeded', attempt: 2}));
  const b = list.rows.get('b');
  return {
    stale, fresh, old, zAfterOld, replay, fetch, complete: list.complete,
    bRuns: [b.attempt, b.resumes, b.status],
    order: list.visible().map((s) => `${s.id}:${s.status}`),
  };
}
