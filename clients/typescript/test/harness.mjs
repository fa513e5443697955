// What the live tests share: the servers tests/test_typescript_client.py started (their URLs
// and key in the environment), its control server (API restart, worker SIGKILL, the proxy's
// drop/down/up), and small waits.
import { Ferryman } from "../dist/index.js";

export const URL = process.env.FERRYMAN_URL;
export const PROXY = process.env.FERRYMAN_PROXY_URL;
export const KEY = process.env.FERRYMAN_API_KEY;
const CONTROL = process.env.FERRYMAN_CONTROL_URL;
/** Without them (a bare `npm test`), the live tests skip; the Python test always sets them. */
export const SKIP = URL && PROXY && KEY && CONTROL ? false : "needs FERRYMAN_URL, FERRYMAN_PROXY_URL, FERRYMAN_API_KEY, FERRYMAN_CONTROL_URL";
export const FAST = { reconnectDelayMs: 20, maxReconnectDelayMs: 300 };

/** The server itself, for writes and for the truth. */
export const direct = () => new Ferryman({ baseUrl: URL, apiKey: KEY, ...FAST });
/** Through the proxy that cuts streams. */
export const proxied = (options = {}) => new Ferryman({ baseUrl: PROXY, apiKey: KEY, ...FAST, ...options });

/** POST an action to the control server: restart-api, kill-worker, proxy-drop, proxy-down, proxy-up. */
export async function control(action) {
  const response = await fetch(`${CONTROL}/${action}`, { method: "POST" });
  if (!response.ok) throw new Error(`${action}: ${response.status} ${await response.text()}`);
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** `probe()` until it answers something truthy (errors count as no, as while the API restarts). */
export async function until(probe, timeoutMs = 30_000, what = "a condition") {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const value = await probe();
      if (value) return value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${last}` : ""}`);
    await sleep(50);
  }
}

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export function terminal(client, id, timeoutMs = 60_000) {
  return until(async () => {
    const session = await client.getSession(id);
    return TERMINAL.has(session.status) ? session : null;
  }, timeoutMs, `session ${id} to end`);
}
