// OwnerSessionClient (src/live.ts) against a real server: its picture ends equal to the
// server's through a proxy that cuts the owner stream and drops connections, across an API
// restart and a worker SIGKILL, applying each event once; a new snapshot at once on
// `resync_required`, on an event about a session it does not know and after 5 malformed
// events, and periodically; the health signal; cancel taking 409 as terminal.
import assert from "node:assert/strict";
import test from "node:test";
import { Ferryman, OwnerSessionClient } from "../dist/index.js";
import { FAST, KEY, SKIP, URL, control, direct, proxied, sleep, terminal, until } from "./harness.mjs";

/** What the owner events keep current, by session. */
function view(picture) {
  const entries = [...picture.values()].map((s) => [s.id, [s.title, s.status, s.attempt, s.cancelRequested, s.activeStage, s.error]]);
  return Object.fromEntries(entries.sort(([a], [b]) => a.localeCompare(b)));
}

async function truth(client) {
  const picture = new Map();
  for await (const session of client.iterSessions()) picture.set(session.id, session);
  return view(picture);
}

/** Until the picture is the server's (read again at each change). */
async function settle(live, writer, timeoutMs = 30_000) {
  let expected = await truth(writer);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (live.connected) {
      const seen = view(live.sessions);
      try {
        assert.deepEqual(seen, expected);
        expected = await truth(writer);
        assert.deepEqual(view(live.sessions), expected);
        return;
      } catch (error) {
        if (Date.now() > deadline) throw error;
      }
    }
    expected = await truth(writer).catch(() => expected);
    await sleep(100);
  }
}

function appliedOnce(live) {
  const ids = live.journal.filter((e) => e.outcome === "applied").map((e) => BigInt(e.id));
  for (let i = 1; i < ids.length; i += 1) assert.ok(ids[i] > ids[i - 1], `applied out of order or twice: ${ids[i - 1]}, ${ids[i]}`);
}

test("the picture through cuts, drops, an API restart and a worker SIGKILL is the server's", { skip: SKIP }, async () => {
  const writer = direct();
  const cursors = [];
  const live = new OwnerSessionClient(proxied(), { journalSize: 10_000, onChange: (c) => cursors.push(BigInt(c.lastEventId ?? 0)) });
  await live.start();
  try {
    const made = [];
    for (let i = 0; i < 12; i += 1) {
      made.push(await writer.createSession({ title: `live ${i}` }));
      if (i % 3 === 0) await writer.renameSession(made[i].id, `renamed ${i}`);
      if (i % 4 === 1) await writer.cancelSession(made[i].id);
      if (i % 5 === 2) await writer.deleteSession(made[i - 1].id);
      if (i % 4 === 3) await control("proxy-drop");
    }
    const run = await writer.createSession({ prompt: "nap", script: [{ toolCalls: [{ name: "sleep", arguments: { seconds: 3 } }] }, { text: "Up." }] });
    await until(async () => live.sessions.get(run.id)?.status === "running", 30_000, "the run to start");
    await control("kill-worker");
    await control("restart-api");
    await writer.renameSession(run.id, "after the restart");
    assert.equal((await terminal(writer, run.id)).status, "succeeded");
    await settle(live, writer);
    assert.equal(live.sessions.get(run.id).attempt, 2, "the takeover's attempt");
    assert.ok(live.journal.some((e) => e.type === "session_resumed" && e.outcome === "applied"));
    appliedOnce(live);
    for (let i = 1; i < cursors.length; i += 1) assert.ok(cursors[i] >= cursors[i - 1] || live.snapshots > 1);
    assert.equal(live.healthy, true);
  } finally {
    await live.close();
  }
});

test("resync_required (a cursor ahead of the server) takes a new snapshot at once", { skip: SKIP }, async () => {
  const writer = direct();
  let bumped = false;
  // As after a restore of an older database: the client's cursor is ahead of the server's.
  const ahead = (input, init) => {
    const headers = new Headers(init?.headers);
    if (String(input).includes("/owner-events") && headers.has("Last-Event-ID") && !bumped) {
      bumped = true;
      headers.set("Last-Event-ID", String(BigInt(headers.get("Last-Event-ID")) + 1_000_000n));
    }
    return fetch(input, { ...init, headers });
  };
  const live = new OwnerSessionClient(new Ferryman({ baseUrl: URL, apiKey: KEY, ...FAST, fetch: ahead }));
  await live.start();
  try {
    await live.waitUntil(() => live.snapshots === 2 && live.connected, 10_000);
    assert.ok(live.journal.some((e) => e.type === "resync_required" && e.outcome === "resync"));
    const later = await writer.createSession({ title: "after the resync" });
    await live.waitUntil((p) => p.has(later.id), 10_000);
    await settle(live, writer);
  } finally {
    await live.close();
  }
});

test("an event about a session it does not know takes a new snapshot", { skip: SKIP }, async () => {
  const writer = direct();
  const missed = await writer.createSession({ title: "missed" });
  const live = await new OwnerSessionClient(direct()).start();
  try {
    await live.waitUntil(() => live.connected, 10_000);
    live.sessions.delete(missed.id); // as if the snapshot had missed it
    await writer.renameSession(missed.id, "seen again");
    const picture = await live.waitUntil((p) => p.has(missed.id), 10_000);
    assert.equal(picture.get(missed.id).title, "seen again");
    assert.equal(live.snapshots, 2);
    assert.ok(live.journal.some((e) => e.outcome === "unknown_session"));
  } finally {
    await live.close();
  }
});

/** A fetch whose owner streams start with `count` frames that are not JSON, on the first connection. */
function garbling(count) {
  let done = false;
  return async (input, init) => {
    const response = await fetch(input, init);
    if (!String(input).includes("/owner-events") || done || !response.body) return response;
    done = true;
    const junk = new TextEncoder().encode("event: session_title\ndata: {not json\n\n".repeat(count));
    const body = response.body.pipeThrough(
      new TransformStream({
        start(controller) {
          controller.enqueue(junk);
        },
      }),
    );
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

test("five malformed events take a new snapshot; four do not", { skip: SKIP }, async () => {
  const four = new OwnerSessionClient(new Ferryman({ baseUrl: URL, apiKey: KEY, ...FAST, fetch: garbling(4) }));
  const five = new OwnerSessionClient(new Ferryman({ baseUrl: URL, apiKey: KEY, ...FAST, fetch: garbling(5) }));
  await four.start();
  await five.start();
  try {
    await four.waitUntil(() => four.connected, 10_000);
    await five.waitUntil(() => five.snapshots === 2 && five.connected, 10_000);
    assert.deepEqual([four.snapshots, four.malformed], [1, 4]);
    assert.equal(five.malformed, 0, "counted afresh from the new snapshot");
    assert.equal(five.journal.filter((e) => e.outcome === "malformed").length, 5);
    const writer = direct();
    const later = await writer.createSession({ title: "after the junk" });
    await five.waitUntil((p) => p.has(later.id), 10_000);
    await four.waitUntil((p) => p.has(later.id), 10_000);
  } finally {
    await four.close();
    await five.close();
  }
});

test("a snapshot every reconcile interval, jittered, while connected", { skip: SKIP }, async () => {
  const times = [];
  let before = 0;
  const live = new OwnerSessionClient(direct(), {
    reconcileIntervalMs: 400,
    onChange: (c) => {
      if (c.snapshots !== before) times.push(Date.now());
      before = c.snapshots;
    },
  });
  await live.start();
  try {
    await live.waitUntil(() => live.snapshots >= 5, 10_000);
    const gaps = times.slice(1).map((t, i) => t - times[i]);
    assert.ok(gaps.every((gap) => gap >= 300 && gap < 1500), `gaps ${gaps}`);
    await live.waitUntil(() => live.connected, 5_000);
  } finally {
    await live.close();
  }
});

test("failed reconnects turn the health signal off, and a reconnect on again", { skip: SKIP }, async () => {
  const health = [];
  const live = new OwnerSessionClient(proxied(), { unhealthyAfterMs: 600, onHealthChange: (healthy) => health.push(healthy) });
  await live.start();
  try {
    await live.waitUntil(() => live.connected, 10_000);
    await control("proxy-down");
    await control("proxy-drop");
    await live.waitUntil(() => !live.connected, 10_000);
    await sleep(300);
    assert.equal(live.healthy, true, "not yet: failing for less than unhealthyAfterMs");
    await live.waitUntil(() => !live.healthy, 5_000);
  } finally {
    await control("proxy-up");
  }
  try {
    await live.waitUntil(() => live.connected && live.healthy, 15_000);
    assert.deepEqual(health, [false, true]);
  } finally {
    await live.close();
  }
});

test("cancel takes 409 as already terminal", { skip: SKIP }, async () => {
  const writer = direct();
  const live = await new OwnerSessionClient(direct()).start();
  try {
    const finished = await writer.createSession({ prompt: "hi", script: [{ text: "done" }] });
    await terminal(writer, finished.id);
    const answer = await live.cancel(finished.id);
    assert.deepEqual([answer.id, answer.status], [finished.id, "succeeded"]);
    const idle = await writer.createSession({ title: "idle" });
    const accepted = await live.cancel(idle.id);
    assert.equal(accepted.cancelRequested, true);
    await live.waitUntil((p) => p.get(idle.id)?.status === "cancelled", 10_000);
  } finally {
    await live.close();
  }
});

test("a wrong key fails the first snapshot", { skip: SKIP }, async () => {
  const live = new OwnerSessionClient(new Ferryman({ baseUrl: URL, apiKey: `${KEY}x` }));
  await assert.rejects(live.start(), (error) => error.status === 401 && error.code === "INVALID_API_KEY");
});

test("a range: a filtered page at a time, and sessions moving into and out of it", { skip: SKIP }, async () => {
  const writer = direct();
  const tag = `range ${Date.now()}`;
  const made = [];
  for (let i = 0; i < 5; i += 1) made.push(await writer.createSession({ title: `${tag} ${i}` }));
  const other = await writer.createSession({ title: "elsewhere" });
  const live = await new OwnerSessionClient(proxied(), { range: { q: ` ${tag.toUpperCase()} `, pageSize: 2 } }).start();
  const ids = () => [...live.sessions.keys()].sort();
  const newest = (n) => made.slice(-n).map((s) => s.id).sort();
  const told = (id, outcome) => live.journal.some((e) => e.sessionId === id && e.outcome === outcome);
  try {
    assert.deepEqual(ids(), newest(2));
    assert.equal(live.complete, false);
    await live.waitUntil(() => live.connected, 10_000);
    // Still in the filter, but older than the pages loaded: not pulled in.
    await writer.renameSession(made[0].id, `${tag} oldest`);
    await until(() => told(made[0].id, "outside"), 10_000, "the rename of one beyond the pages");
    assert.deepEqual(ids(), newest(2));
    assert.equal(await live.loadMore(), true);
    assert.deepEqual(ids(), newest(4));
    assert.equal(await live.loadMore(), true);
    assert.deepEqual(ids(), newest(5));
    assert.equal(live.sessions.get(made[0].id).title, `${tag} oldest`);
    assert.equal(live.complete, true);
    assert.equal(await live.loadMore(), false);
    // Out of the filter by a rename; one from outside renamed in; a new one; a deleted one.
    await writer.renameSession(made[0].id, "renamed away");
    await live.waitUntil((p) => !p.has(made[0].id), 10_000);
    await writer.renameSession(other.id, `${tag} joined`);
    await live.waitUntil((p) => p.get(other.id)?.title === `${tag} joined`, 10_000);
    const fresh = await writer.createSession({ title: `${tag} new` });
    const unrelated = await writer.createSession({ title: "not in range" });
    await writer.deleteSession(made[1].id);
    await live.waitUntil((p) => p.has(fresh.id) && !p.has(made[1].id), 10_000);
    assert.equal(live.sessions.has(unrelated.id), false);
    const truth = [];
    for await (const session of writer.iterSessions({ q: tag })) truth.push(session.id);
    assert.deepEqual(ids(), truth.sort());
    assert.equal(live.snapshots, 1, "a range takes no snapshot for sessions outside it");
  } finally {
    await live.close();
  }
});
