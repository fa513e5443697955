// The HTTP API through @ferryman/client (ferryman-client.js, the package bundled by
// `make web-client`): the key, kept for this tab in sessionStorage, and what a person reads
// for a failure.

import {AuthenticationError, Ferryman, FerrymanConnectionError, FerrymanError} from './ferryman-client.js';

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

let client = null;

// The client for this origin and the tab's key (a new key, a new client). Its streams read
// `fetch` bodies, so the key rides in the Authorization header, never in a URL.
export function ferryman() {
  const key = auth.key || null;
  if (client === null || client.apiKey !== key) client = new Ferryman({baseUrl: location.origin, apiKey: key});
  return client;
}

// `fn(client)`; a refused key asks for another, and is thrown on like any failure.
export async function call(fn) {
  try {
    return await fn(ferryman());
  } catch (error) {
    unauthorized(error);
    throw error;
  }
}

export function unauthorized(error) {
  if (error instanceof AuthenticationError) auth.onUnauthorized();
  return error instanceof AuthenticationError;
}

// What the page says for a failure: each field at fault, or the problem's words and code.
export function problemText(error) {
  if (error instanceof FerrymanConnectionError) return 'The server cannot be reached. Is it running?';
  if (!(error instanceof FerrymanError)) return String(error?.message || error);
  if (error.errors.length) return error.errors.map((f) => `${f.field}: ${f.message}`).join('; ');
  const words = error.detail || error.title;
  return error.code.startsWith('HTTP_') ? words : `${words} (${error.code})`;
}
