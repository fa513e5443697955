// Session and owner streams over fetch through a proxy that cuts every stream a few KB in,
// across an API restart and a worker SIGKILL: every durable event exactly once, in order, as
// the transcript (or a clean replay) has them, and the fold equal to the transcript's.
import assert from "node:assert/strict";
import test from "node:test";
import { INTERRUPTED, SessionFold } from "../dist/index.js";
import { SKIP, control, direct, proxied, terminal } from "./harness.mjs";

/** Read a session stream to its end (a finished session's `follow: false`, or `until`). */
async function read(client, id, onEvent = () => {}, options = {}) {
  const events = [];
  let connections = 0;
  const stream = client.sessionEvents(id, { ...options, onConnection: (up) => (connections += up ? 1 : 0) });
  for await (const event of stream) {
    events.push(event);
    await onEvent(event, events);
  }
  return { events, connections };
}

async function transcriptOf(client, id) {
  const events = [];
  for await (const event of client.iterTranscript(id)) events.push(event);
  return events;
}

function folded(frames) {
  const fold = new SessionFold();
  fold.applyAll(frames);
  return fold.snapshot();
}

const done = (event) => event.type === "session_end" && ["succeeded", "failed", "cancelled"].includes(event.data.status);

test("a session stream cut every few KB shows every event once, and folds as its transcript", { skip: SKIP }, async () => {
  const writer = direct();
  // Many events, each smaller than the proxy's cut (a bigger one could never get through).
  const long = "word ".repeat(100);
  const note = (i) => ({ text: long, chunks: 5, delayMs: 10, toolCalls: [{ name: "put_note", arguments: { key: `k${i}`, text: long } }] });
  const script = [...Array.from({ length: 8 }, (_, i) => note(i)), { text: long, chunks: 5, delayMs: 10 }];
  const session = await writer.createSession({ prompt: "talk", script });
  const controller = new AbortController();
  const { events, connections } = await read(proxied(), session.id, (event) => done(event) && controller.abort(), { signal: controller.signal });
  const durable = events.filter((e) => e.durable).map((e) => e.id);
  const logged = await transcriptOf(writer, session.id);
  assert.deepEqual(durable, logged.map((e) => String(e.seq)), "each event once, in order");
  assert.ok(connections > 2, `the stream was cut (${connections} connections)`);
  const streamed = folded(events);
  assert.deepEqual(streamed.messages, folded(logged).messages);
  assert.equal(streamed.messages.at(-1).text, long);
});

test("a worker SIGKILL mid-tool and an API restart: the session stream shows each event once", { skip: SKIP }, async () => {
  const writer = direct();
  const script = [
    { text: "Napping.", toolCalls: [{ name: "sleep", arguments: { seconds: 4 } }] },
    { text: "Awake now.", chunks: 4, delayMs: 30 },
  ];
  const session = await writer.createSession({ prompt: "nap", script });
  const controller = new AbortController();
  let acted = false;
  let nap = null;
  const { events } = await read(
    proxied(),
    session.id,
    async (event) => {
      if (event.type === "tool_call_start" && !acted) {
        acted = true;
        nap = event.data.toolCallId;
        await control("kill-worker");
        await control("restart-api");
      }
      if (done(event)) controller.abort();
    },
    { signal: controller.signal },
  );
  assert.ok(acted, "the tool never started");
  const durable = events.filter((e) => e.durable).map((e) => e.id);
  const logged = await transcriptOf(writer, session.id);
  assert.deepEqual(durable, logged.map((e) => String(e.seq)), "each event once, in order");
  const resumed = events.find((e) => e.type === "session_resumed");
  assert.ok(resumed, "no takeover in the stream");
  assert.deepEqual(resumed.data.repairedToolCalls, [nap]);
  const picture = folded(events);
  const call = picture.toolCalls.find((c) => c.id === nap);
  assert.deepEqual([call.status, call.error, call.interrupted], ["failed", INTERRUPTED, true]);
  assert.ok(picture.toolCalls.every((c) => c.id === nap || !c.interrupted), "only the repaired call");
  assert.equal(picture.status, "succeeded");
  assert.deepEqual(picture, folded(logged));
  assert.equal((await terminal(writer, session.id)).status, "succeeded");
});

test("the owner stream through cuts, drops and an API restart: every event once, as a clean replay has them", { skip: SKIP }, async () => {
  const writer = direct();
  const cursor = (await writer.listSessions({ limit: 1 })).cursor;
  const controller = new AbortController();
  const seen = [];
  const reading = (async () => {
    for await (const event of proxied().ownerEvents({ cursor, signal: controller.signal })) {
      if (event.id !== null) seen.push(event.id);
    }
  })();
  const made = [];
  for (let i = 0; i < 12; i += 1) {
    made.push(await writer.createSession({ title: `owner ${i}` }));
    await writer.renameSession(made[i].id, `owner ${i} renamed ${"x".repeat(150)}`);
    if (i % 3 === 1) await writer.cancelSession(made[i].id);
    if (i === 4) await control("proxy-drop");
    if (i === 8) await control("restart-api");
  }
  const last = await writer.createSession({ title: "the last" });
  // The reference: a clean replay from the same cursor, read until caught up.
  const replay = [];
  const clean = new AbortController();
  for await (const event of direct().ownerEvents({ cursor, signal: clean.signal })) {
    if (event.id !== null) replay.push(event.id);
    if (event.type === "caught_up") clean.abort();
  }
  const deadline = Date.now() + 20_000;
  while (seen.at(-1) !== replay.at(-1) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  controller.abort();
  await reading;
  assert.ok(replay.length >= 12 * 2 + 4 + 1, `replayed ${replay.length}`);
  assert.deepEqual(seen, replay, "each owner event once, in order");
  assert.ok(last.id);
});
