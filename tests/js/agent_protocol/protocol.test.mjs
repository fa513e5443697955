// The official JavaScript SDK, @langchain/langgraph-sdk, against Ferryman's Agent Protocol: an
// assistant and a thread, a run streamed token by token with a tool call, state and history, an
// interrupt answered with command.resume, a cancelled run, and a run's stream joined after the
// API process restarted and after the worker was SIGKILLed, every event seen exactly once.
//
// Run by tests/test_agent_protocol_js.py (`node --test --test-concurrency=1`): the restarts act
// on the processes every test here uses, so the tests run one at a time.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  STREAM_MODES,
  assertExactlyOnce,
  assertWellFormed,
  client,
  collect,
  control,
  eventually,
  isChunk,
  readUntil,
  replay,
  runIdOf,
  scripted,
  scriptedAssistant,
  streamedPieces,
  streamedTexts,
  streamedToolCalls,
  summary,
  text,
  userMessage,
} from "./harness.mjs";

const sdk = client();

const NOTE_SCRIPT = [
  {
    text: "Let me write that down.",
    chunks: 6,
    delayMs: 1500,
    toolCalls: [{ name: "put_note", arguments: { key: "sky", text: "blue" } }],
  },
  { text: "Noted: the sky is blue.", chunks: 6, delayMs: 1500 },
];

async function newThread(metadata = {}) {
  const thread = await sdk.threads.create({ metadata: { test: "agent-protocol-js", ...metadata } });
  assert.ok(thread.thread_id, JSON.stringify(thread));
  return thread;
}

test("an assistant and a thread: a run streams its tokens and a tool call, then state and history", async () => {
  const assistant = await scriptedAssistant(sdk, "note-taker");
  assert.equal((await sdk.assistants.get(assistant.assistant_id)).name, "note-taker");
  const thread = await newThread({ case: "stream" });
  assert.equal((await sdk.threads.get(thread.thread_id)).metadata.case, "stream");

  const events = await collect(
    sdk.runs.stream(thread.thread_id, assistant.assistant_id, {
      input: userMessage("Remember that the sky is blue."),
      ...scripted(NOTE_SCRIPT),
      streamMode: STREAM_MODES,
    }),
  );
  assertWellFormed(events);
  const kinds = new Set(events.map((e) => e.event.split("|")[0]));
  for (const kind of ["values", "updates", "messages", "events"]) {
    assert.ok(kinds.has(kind), `no ${kind} event: ${summary(events)}`);
  }
  // Token by token: each reply arrives in several chunks that join to its text.
  const texts = [...streamedTexts(events).values()];
  assert.deepEqual(texts, ["Let me write that down.", "Noted: the sky is blue."]);
  for (const [id, pieces] of streamedPieces(events)) {
    assert.ok(pieces >= 3, `message ${id} came in ${pieces} pieces: ${summary(events)}`);
  }
  assert.deepEqual(streamedToolCalls(events), ["put_note"]);

  // The last `values` is the state: the conversation in the SDK's message format.
  const state = await sdk.threads.getState(thread.thread_id);
  const last = events.findLast((e) => e.event === "values");
  assert.deepEqual(last.data.messages, state.values.messages);
  const messages = state.values.messages;
  assert.deepEqual(
    messages.map((m) => m.type),
    ["human", "ai", "tool", "ai"],
  );
  assert.equal(text(messages[0]), "Remember that the sky is blue.");
  const [call] = messages[1].tool_calls;
  assert.equal(call.name, "put_note");
  assert.deepEqual(call.args, { key: "sky", text: "blue" });
  assert.equal(messages[2].tool_call_id, call.id);
  assert.equal(text(messages[3]), "Noted: the sky is blue.");
  assert.deepEqual(state.next, []);
  assert.deepEqual(state.tasks, []);
  assert.equal((await sdk.threads.get(thread.thread_id)).status, "idle");

  // History: the states after each step, newest first, with checkpoint ids that stay the same.
  const history = await sdk.threads.getHistory(thread.thread_id, { limit: 100 });
  assert.ok(history.length >= 2, JSON.stringify(history));
  assert.equal(history[0].checkpoint.checkpoint_id, state.checkpoint.checkpoint_id);
  assert.deepEqual(history[0].values.messages, messages);
  const sizes = history.map((h) => h.values.messages?.length ?? 0);
  assert.deepEqual(sizes, [...sizes].sort((a, b) => b - a), `not newest first: ${sizes}`);
  const again = await sdk.threads.getHistory(thread.thread_id, { limit: 100 });
  assert.deepEqual(
    again.map((h) => h.checkpoint.checkpoint_id),
    history.map((h) => h.checkpoint.checkpoint_id),
  );
  // A past checkpoint's state reads back by its id.
  const past = history.at(-1);
  const atPast = await sdk.threads.getState(thread.thread_id, past.checkpoint.checkpoint_id);
  assert.deepEqual(atPast.values, past.values);

  const runs = await sdk.runs.list(thread.thread_id);
  assert.equal(runs.length, 1);
  assert.equal(runs[0].run_id, events[0].data.run_id);
  assert.equal(runs[0].status, "success");
});

test("an interrupt: ask_user shows as the thread's interrupt and command.resume answers it", async () => {
  const assistant = await scriptedAssistant(sdk, "asker");
  const thread = await newThread({ case: "interrupt" });
  const asked = await collect(
    sdk.runs.stream(thread.thread_id, assistant.assistant_id, {
      input: userMessage("Pick a colour for me."),
      ...scripted([
        { toolCalls: [{ name: "ask_user", arguments: { question: "Which colour?", options: ["red", "blue"] } }] },
        { text: "Blue it is.", chunks: 3 },
      ]),
      streamMode: ["values", "updates", "messages-tuple"],
    }),
  );
  assertWellFormed(asked);
  const interrupted = asked.findLast((e) => e.event === "values").data;
  assert.ok(interrupted.__interrupt__?.length === 1, JSON.stringify(interrupted));
  assert.match(JSON.stringify(interrupted.__interrupt__[0].value), /Which colour\?/);

  assert.equal((await sdk.threads.get(thread.thread_id)).status, "interrupted");
  const state = await sdk.threads.getState(thread.thread_id);
  assert.ok(state.next.length > 0, JSON.stringify(state));
  const interrupts = state.tasks.flatMap((t) => t.interrupts);
  assert.equal(interrupts.length, 1, JSON.stringify(state.tasks));
  assert.match(JSON.stringify(interrupts[0].value), /Which colour\?/);
  assert.equal(interrupts[0].id, interrupted.__interrupt__[0].id);

  const answered = await collect(
    sdk.runs.stream(thread.thread_id, assistant.assistant_id, {
      command: { resume: "blue" },
      streamMode: ["values", "messages-tuple"],
    }),
  );
  assertWellFormed(answered);
  assert.deepEqual([...streamedTexts(answered).values()], ["Blue it is."]);
  const after = await sdk.threads.getState(thread.thread_id);
  assert.deepEqual(after.tasks, []);
  assert.equal(text(after.values.messages.at(-1)), "Blue it is.");
  assert.match(JSON.stringify(after.values.messages), /blue/);
  assert.equal((await sdk.threads.get(thread.thread_id)).status, "idle");
});

test("cancel: a run in a long tool call is cancelled and the thread says so", async () => {
  const assistant = await scriptedAssistant(sdk, "sleeper");
  const thread = await newThread({ case: "cancel" });
  const run = await sdk.runs.create(thread.thread_id, assistant.assistant_id, {
    input: userMessage("Take a long nap."),
    ...scripted([{ toolCalls: [{ name: "sleep", arguments: { seconds: 60 } }] }]),
  });
  await eventually(
    async () => (await sdk.runs.get(thread.thread_id, run.run_id)).status === "running",
    "the run is running",
  );
  const started = Date.now();
  await sdk.runs.cancel(thread.thread_id, run.run_id, true);
  assert.ok(Date.now() - started < 15_000, "cancel with wait took the whole nap");
  const cancelled = await sdk.runs.get(thread.thread_id, run.run_id);
  assert.equal(cancelled.status, "interrupted", JSON.stringify(cancelled));
  assert.notEqual((await sdk.threads.get(thread.thread_id)).status, "busy");
  // Joining a cancelled run returns at once with the thread's state.
  await sdk.runs.join(thread.thread_id, run.run_id);
});

// --- recovery: the client goes away, the process restarts or dies, the client joins again ----

const LONG_REPLY = "Counting slowly: one, two, three, four, five, six, seven, eight, nine, ten.";
// Slow enough that the reply is still streaming once a restart (seconds on a busy machine) is done.
const SLOW_SCRIPT = [{ text: LONG_REPLY, chunks: 30, delayMs: 20000 }];

test("join after the API process restarted mid-reply: every event exactly once", async () => {
  const assistant = await scriptedAssistant(sdk, "slow-talker");
  const thread = await newThread({ case: "api-restart" });
  const before = await readUntil(
    sdk.runs.stream(thread.thread_id, assistant.assistant_id, {
      input: userMessage("Count to ten, slowly."),
      ...scripted(SLOW_SCRIPT),
      streamMode: STREAM_MODES,
      streamResumable: true,
    }),
    (_, seen) => seen.filter(isChunk).length >= 3,
  );
  const runId = runIdOf(before);
  await control("restart-api");
  // A new connection, to the new process, from the last event this client saw.
  const after = await collect(
    sdk.runs.joinStream(thread.thread_id, runId, {
      lastEventId: before.at(-1).id,
      streamMode: STREAM_MODES,
    }),
  );
  assert.ok(after.filter(isChunk).length > 0, `no chunk after the restart: ${summary(after)}`);
  assertExactlyOnce([...before, ...after], await replay(sdk, thread.thread_id, runId));
  assert.deepEqual([...streamedTexts([...before, ...after]).values()], [LONG_REPLY]);
  const state = await sdk.threads.getState(thread.thread_id);
  assert.equal(text(state.values.messages.at(-1)), LONG_REPLY);
});

test("the SDK's own reconnect rides out an API restart within one runs.stream", async () => {
  const assistant = await scriptedAssistant(sdk, "slow-talker-2");
  const thread = await newThread({ case: "sdk-reconnect" });
  const seen = [];
  let restart;
  for await (const part of sdk.runs.stream(thread.thread_id, assistant.assistant_id, {
    input: userMessage("Count to ten, slowly."),
    ...scripted(SLOW_SCRIPT),
    streamMode: STREAM_MODES,
    streamResumable: true,
  })) {
    seen.push(part);
    if (restart === undefined && seen.filter(isChunk).length >= 3) restart = control("restart-api");
  }
  await restart;
  assert.ok(restart, `never restarted: ${summary(seen)}`);
  assertExactlyOnce(seen, await replay(sdk, thread.thread_id, runIdOf(seen)));
  assert.deepEqual([...streamedTexts(seen).values()], [LONG_REPLY]);
});

test("join after the worker was SIGKILLed mid-tool: every event exactly once, the takeover as custom", async () => {
  const assistant = await scriptedAssistant(sdk, "napper");
  const thread = await newThread({ case: "worker-kill" });
  const before = await readUntil(
    sdk.runs.stream(thread.thread_id, assistant.assistant_id, {
      input: userMessage("Nap, then tell me."),
      ...scripted([
        { text: "A short nap first.", chunks: 3, toolCalls: [{ name: "sleep", arguments: { seconds: 4 } }] },
        { text: "Awake again after the nap.", chunks: 5, delayMs: 500 },
      ]),
      streamMode: STREAM_MODES,
      streamResumable: true,
    }),
    // Mid-tool: the sleep has started (its `on_tool_start`), the client goes, the worker dies.
    (part) => part.event === "events" && part.data.event === "on_tool_start" && part.data.name === "sleep",
  );
  const runId = runIdOf(before);
  await control("kill-worker");
  const after = await collect(
    sdk.runs.joinStream(thread.thread_id, runId, {
      lastEventId: before.at(-1).id,
      streamMode: STREAM_MODES,
    }),
  );
  const whole = await replay(sdk, thread.thread_id, runId);
  assertExactlyOnce([...before, ...after], whole);
  const takeovers = whole.filter(
    (e) => e.event === "custom" && JSON.stringify(e.data).includes("session_resumed"),
  );
  assert.equal(takeovers.length, 1, summary(whole));
  const state = await sdk.threads.getState(thread.thread_id);
  const messages = state.values.messages;
  // The killed call is answered as interrupted, and the scripted model replays its turn (SPEC
  // section 6): the second call is the one that slept.
  const results = messages.filter((m) => m.type === "tool");
  assert.equal(results.length, 2, JSON.stringify(messages));
  assert.match(text(results[0]), /interrupted/);
  assert.notEqual(results[1].status, "error", JSON.stringify(results[1]));
  assert.equal(text(messages.at(-1)), "Awake again after the nap.");
  assert.equal((await sdk.runs.get(thread.thread_id, runId)).status, "success");
});

test("crons: create, createForThread, search, count, update and delete over the caller's schedules", async () => {
  const cron = await sdk.crons.create("ferryman", {
    schedule: "30 2 * * *",
    timezone: "Europe/Berlin",
    input: userMessage("Write the nightly report."),
    metadata: { test: "agent-protocol-js-crons" },
  });
  assert.ok(cron.cron_id, JSON.stringify(cron));
  assert.equal(cron.timezone, "Europe/Berlin");
  assert.equal(cron.thread_id, null);
  assert.ok(new Date(cron.next_run_date) > new Date(), cron.next_run_date);
  const thread = await newThread({ case: "crons" });
  const bound = await sdk.crons.createForThread(thread.thread_id, "ferryman", {
    schedule: "@daily",
    input: userMessage("tick"),
    metadata: { test: "agent-protocol-js-crons" },
  });
  assert.equal(bound.thread_id, thread.thread_id);

  const mine = { metadata: { test: "agent-protocol-js-crons" } };
  assert.equal(await sdk.crons.count(mine), 2);
  const found = await sdk.crons.search({ ...mine, threadId: thread.thread_id });
  assert.deepEqual(found.map((c) => c.cron_id), [bound.cron_id]);

  const paused = await sdk.crons.update(cron.cron_id, { schedule: "0 6 * * *", enabled: false });
  assert.equal(paused.schedule, "0 6 * * *");
  assert.equal(paused.enabled, false);
  assert.equal(paused.next_run_date, null);
  await assert.rejects(
    sdk.crons.create("ferryman", { schedule: "61 * * * *", input: userMessage("x") }),
    (err) => err.status === 422,
  );

  await sdk.crons.delete(cron.cron_id);
  await sdk.crons.delete(bound.cron_id);
  assert.equal(await sdk.crons.count(mine), 0);
  await assert.rejects(sdk.crons.delete(cron.cron_id), (err) => err.status === 404);
});
