// The session list: pages of `GET /api/agent` and the owner stream folded together. Pure data.
//
// Each row remembers the owner-event cursor of the snapshot it came from (`asOf`), so an owner
// event older than the row (the stream starts at the first page's cursor; later pages are newer
// snapshots) never takes it back in time, and an event already applied is never applied again.

export const STATUSES = ['idle', 'queued', 'running', 'waiting', 'succeeded', 'failed', 'cancelled'];

export class SessionList {
  constructor({status = '', search = ''} = {}) {
    this.status = status;
    this.search = search;
    this.rows = new Map(); // id -> Session
    this.asOf = new Map(); // id -> the owner-event id its row is as of
    this.cursor = null; // where the owner stream goes on from (the first page's snapshot)
    this.lastEventId = 0; // the last owner event applied
    this.nextPageToken = null;
    this.pages = 0;
  }

  get complete() {
    return this.pages > 0 && !this.nextPageToken;
  }

  matches(session) {
    if (this.status && session.status !== this.status) return false;
    const search = this.search.trim().toLowerCase();
    return !search || String(session.title || '').toLowerCase().includes(search);
  }

  // A page of `GET /api/agent` (the first one sets the stream's cursor).
  addPage(page) {
    const asOf = Number(page.cursor);
    if (this.pages === 0) {
      this.cursor = String(page.cursor);
      this.lastEventId = asOf;
    }
    this.pages += 1;
    this.nextPageToken = page.nextPageToken || null;
    for (const session of page.sessions) this.put(session, asOf);
  }

  put(session, asOf) {
    const known = this.asOf.get(session.id) ?? -1;
    if (asOf < known) return;
    this.rows.set(session.id, {...session});
    this.asOf.set(session.id, asOf);
  }

  // Whether a session fetched on its own (`GET /api/agent/{id}`) belongs in the loaded range.
  inRange(session) {
    if (this.complete) return true;
    const oldest = this.oldest();
    return !oldest || session.createdAt >= oldest.createdAt;
  }

  oldest() {
    let oldest = null;
    for (const s of this.rows.values()) if (!oldest || before(s, oldest)) oldest = s;
    return oldest;
  }

  // Fold in an owner event; returns {changed, fetch}: `fetch` names a session this list does
  // not hold that the event may have brought into the filter (fetch it, then `put` it).
  apply(event) {
    const id = Number(event.id);
    if (!Number.isFinite(id) || id <= this.lastEventId) return {changed: false};
    this.lastEventId = id;
    const data = event.data || {};
    if (event.type === 'session_created') {
      this.put(data.session, id);
      return {changed: true};
    }
    const row = this.rows.get(event.sessionId);
    if (!row) {
      const filtered = Boolean(this.status || this.search.trim());
      const mayMatch = ['session_status', 'session_title'].includes(event.type);
      return {changed: false, fetch: filtered && mayMatch ? event.sessionId : null};
    }
    if (id <= (this.asOf.get(row.id) ?? -1)) return {changed: false};
    this.asOf.set(row.id, id);
    if (event.ts) row.updatedAt = event.ts;
    switch (event.type) {
      case 'session_status':
        row.status = data.status;
        row.attempt = data.attempt ?? row.attempt;
        row.resumes = data.resumes ?? row.resumes; // a claim says it; a takeover moves it
        row.error = data.error ?? (data.status === 'failed' ? row.error : null);
        if (['succeeded', 'failed', 'cancelled', 'waiting'].includes(data.status)) row.lease = null;
        break;
      case 'session_title': row.title = data.title; break;
      case 'session_active_stage': row.activeStage = data.stage ?? null; break;
      case 'session_cancel_requested': row.cancelRequested = true; break;
      case 'session_resumed':
        row.attempt = data.attempt ?? row.attempt;
        row.lease = {workerId: data.workerId, pid: data.pid, expiresAt: null};
        break;
      case 'session_deleted':
        this.rows.delete(row.id);
        break;
      default:
        return {changed: false};
    }
    return {changed: true};
  }

  // What the list shows: the rows that match the filter, newest first.
  visible() {
    return [...this.rows.values()].filter((s) => this.matches(s)).sort((a, b) => (before(a, b) ? 1 : -1));
  }
}

// Whether `a` comes after `b` in the list (older): by creation time, then id, as the server pages.
function before(a, b) {
  if (a.createdAt !== b.createdAt) return a.createdAt < b.createdAt;
  return a.id < b.id;
}
