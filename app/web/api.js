// The HTTP API: the key (kept for this tab in sessionStorage), requests, problems.

const KEY = 'ferryman.apiKey';

export const auth = {
  get key() {
    try { return sessionStorage.getItem(KEY) || ''; } catch { return ''; }
  },
  set(key) {
    try {
      if (key) sessionStorage.setItem(KEY, key);
      else sessionStorage.removeItem(KEY);
    } catch { /* storage refused: the key lasts until the page closes */ }
  },
  // Called on every 401: the page asks for a key.
  onUnauthorized: () => {},
};

// An answer that is not 2xx: an RFC 9457 problem, or a network failure (status 0).
export class ApiError extends Error {
  constructor(status, problem = {}) {
    const fields = Array.isArray(problem.errors) ? problem.errors : [];
    super(describe(status, problem, fields));
    this.status = status;
    this.code = problem.code || '';
    this.detail = problem.detail || '';
    this.fields = fields; // [{field, message, type}] with VALIDATION_ERROR
    this.problem = problem;
  }
}

function describe(status, problem, fields) {
  if (status === 0) return 'The server cannot be reached. Is it running?';
  if (fields.length) return fields.map((f) => `${f.field}: ${f.message}`).join('; ');
  const words = problem.detail || problem.title || `HTTP ${status}`;
  return problem.code ? `${words} (${problem.code})` : words;
}

export async function api(method, path, body) {
  const headers = {Accept: 'application/json'};
  if (auth.key) headers.Authorization = `Bearer ${auth.key}`;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  } catch {
    throw new ApiError(0);
  }
  if (!response.ok) {
    const problem = await response.json().catch(() => ({}));
    if (response.status === 401) auth.onUnauthorized();
    throw new ApiError(response.status, problem);
  }
  return response.status === 204 ? null : response.json();
}

// A stream's URL: browsers' EventSource sends no headers, so the key rides in the query.
export function streamUrl(path, lastEventId) {
  const query = new URLSearchParams();
  if (lastEventId !== undefined && lastEventId !== null) query.set('lastEventId', String(lastEventId));
  if (auth.key) query.set('access_token', auth.key);
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

export const sessionPath = (id, tail = '') => `/api/agent/${encodeURIComponent(id)}${tail}`;
