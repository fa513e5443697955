// What the tests share: the SDK client on the server under test, scripted assistants, the test's
// controls (restart the API, SIGKILL the worker: tests/test_agent_protocol_js.py serves them),
// and readers of a run's stream.
//
// The environment comes from tests/test_agent_protocol_js.py: FERRYMAN_AGENT_PROTOCOL_URL (the
// protocol's root, `<server>/agent-protocol`), FERRYMAN_API_KEY and FERRYMAN_CONTROL_URL.

import assert from "node:assert/strict";

import { Client } from "@langchain/langgraph-sdk";

export const API_URL = required("FERRYMAN_AGENT_PROTOCOL_URL");
const API_KEY = required("FERRYMAN_API_KEY");
const CONTROL_URL = required("FERRYMAN_CONTROL_URL");

// Every mode the protocol serves, so each test sees all of them interleaved.
export const STREAM_MODES = ["values", "updates", "messages-tuple", "events", "custom"];

function required(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run these through tests/test_agent_protocol_js.py`);
  return value;
}

/** The official client, as an application makes it: a URL and an API key (sent as x-api-key). */
export function client() {
  return new Client({ apiUrl: API_URL, apiKey: API_KEY });
}

/** Ask the test to act on the processes it runs (`restart-api`, `kill-worker`); resolves once
 * done (for `restart-api`, when the new API process answers). */
export async function control(action) {
  const response = await fetch(`${CONTROL_URL}/${action}`, { method: "POST" });
  assert.equal(response.status, 200, `control ${action}: ${await response.text()}`);
}

/** A stored assistant running Ferryman's agent loop (graph `ferryman`) on the scripted model
 * (SPEC section 6); the definition travels in the assistant's `context`, as the SDKs send an
 * assistant's configuration. The script itself is a run's: see `scripted`. */
export async function scriptedAssistant(sdk, name) {
  const assistant = await sdk.assistants.create({
    graphId: "ferryman",
    name,
    context: { model: "scripted" },
  });
  assert.ok(assistant.assistant_id, JSON.stringify(assistant));
  return assistant;
}

/** The `context` of a thread's first run that plays `script` (the scripted model's turns):
 * a run's context overrides its assistant's definition. */
export const scripted = (script) => ({ context: { script } });

export const userMessage = (text) => ({ messages: [{ role: "user", content: text }] });

/** Every event of a stream, as the SDK yields them: `{id, event, data}`. */
export async function collect(stream, seen = []) {
  for await (const part of stream) seen.push(part);
  return seen;
}

/** Read a stream until `stop(part, seen)` holds (true: the part that made it is kept), then
 * leave it, as a client that goes away does (the SDK aborts the request). */
export async function readUntil(stream, stop) {
  const seen = [];
  for await (const part of stream) {
    seen.push(part);
    if (stop(part, seen)) return seen;
  }
  throw new Error(`the stream ended before the condition held: ${summary(seen)}`);
}

/** The whole of a run's stream from its first event (`Last-Event-ID: -1`, as useStream's
 * reconnectOnMount replays a run), to compare what a client pieced together with. */
export async function replay(sdk, threadId, runId) {
  return collect(sdk.runs.joinStream(threadId, runId, { lastEventId: "-1" }));
}

/** A stream's events are well formed: `metadata` first, `end` last, every event with an id, no
 * id twice. */
export function assertWellFormed(events) {
  assert.ok(events.length >= 2, summary(events));
  assert.equal(events[0].event, "metadata", summary(events));
  assert.equal(events.at(-1).event, "end", summary(events));
  const ids = events.map((e) => e.id);
  assert.ok(
    ids.every((id) => typeof id === "string" && id !== ""),
    `an event without an id: ${summary(events)}`,
  );
  assert.equal(new Set(ids).size, ids.length, `an id twice: ${ids.join(" ")}`);
}

/** What a client pieced together from several connections is the run's stream exactly: each
 * event once, in order, none missing, none repeated. `whole` is the run read again from its
 * start after it ended: its durable events (a token chunk of a finished turn is not sent again:
 * the turn's last chunk carries its text). So the pieced stream is `whole` plus token chunks,
 * which with each turn's last chunk must join to its message's text with no gap and no repeat
 * (`assertChunksWhole`). */
export function assertExactlyOnce(pieced, whole) {
  assertWellFormed(whole);
  assertWellFormed(pieced);
  const durableIds = new Set(whole.map((e) => e.id));
  const durable = pieced.filter((e) => durableIds.has(e.id));
  const missing = whole.filter((e) => !pieced.some((p) => p.id === e.id)).map((e) => e.id);
  const others = pieced.filter((e) => !durableIds.has(e.id) && !isTokenChunk(e));
  assert.deepEqual(
    others.map((e) => `${e.id}:${e.event}`),
    [],
    `events the run's stream does not have: ${summary(pieced)}\nthe run's: ${summary(whole)}`,
  );
  assert.deepEqual(
    durable.map((e) => e.id),
    whole.map((e) => e.id),
    `missing: ${missing.join(" ") || "none"}\npieced together: ${summary(pieced)}\nthe run's: ${summary(whole)}`,
  );
  // A turn's last chunk carries the text its stream has not sent yet: all of it on a replay,
  // the rest after chunks. Its text is checked with the chunks'.
  assert.deepEqual(durable.map(withoutChunkText), whole.map(withoutChunkText));
  assertChunksWhole(pieced, durableIds);
}

function withoutChunkText(part) {
  if (!isChunk(part) || part.data[0]?.type !== "AIMessageChunk") return part;
  const [chunk, metadata] = part.data;
  return { ...part, data: [{ ...chunk, content: undefined }, metadata] };
}

/** A token chunk: an AI message chunk of `messages-tuple`, or its `on_chat_model_stream` twin
 * of `events`. */
export function isTokenChunk(part) {
  if (isChunk(part)) return part.data[0]?.type === "AIMessageChunk";
  return part.event === "events" && part.data?.event === "on_chat_model_stream";
}

/** Each AI message's chunks join to its text in the stream's last `values` (none lost, none
 * twice), and `events` has the same token chunks as `messages-tuple` (those not among
 * `durableIds`: a turn's last chunk has no `events` twin), in the same order. */
export function assertChunksWhole(events, durableIds) {
  const final = events.findLast((e) => e.event === "values")?.data?.messages ?? [];
  const texts = streamedTexts(events);
  for (const message of final.filter((m) => m.type === "ai")) {
    if (!texts.has(message.id)) continue;
    const pieces = events
      .filter((e) => isChunk(e) && e.data[0].id === message.id && e.data[0].content)
      .map((e) => `${e.id}:${JSON.stringify(e.data[0].content)}`);
    assert.equal(texts.get(message.id), text(message), `${pieces.join(" ")} in ${summary(events)}`);
  }
  const tuples = events
    .filter((e) => isChunk(e) && !durableIds.has(e.id))
    .map((e) => e.data[0])
    .filter((c) => c.type === "AIMessageChunk" && c.content);
  const streamed = events
    .filter((e) => e.event === "events" && e.data?.event === "on_chat_model_stream")
    .map((e) => e.data.data.chunk)
    .filter((c) => c.content);
  if (streamed.length > 0) {
    assert.deepEqual(
      streamed.map((c) => [c.id, c.content]),
      tuples.map((c) => [c.id, c.content]),
      `events' chunks differ from messages-tuple's: ${summary(events)}`,
    );
  }
}

/** The `metadata` event's run id. */
export function runIdOf(events) {
  const first = events[0];
  assert.equal(first?.event, "metadata", summary(events));
  assert.ok(first.data.run_id, JSON.stringify(first.data));
  return first.data.run_id;
}

/** The token chunks of `messages-tuple` (`messages` events: `[chunk, metadata]`). */
export function chunks(events) {
  return events
    .filter((e) => e.event === "messages" || e.event.startsWith("messages|"))
    .map((e) => e.data[0]);
}

/** The text each AI message was streamed as, joined from its chunks, by message id. */
export function streamedTexts(events) {
  const texts = new Map();
  for (const chunk of chunks(events)) {
    if (typeof chunk.content !== "string" || !chunk.type?.startsWith("AIMessage")) continue;
    texts.set(chunk.id, (texts.get(chunk.id) ?? "") + chunk.content);
  }
  return texts;
}

/** How many chunks with text each AI message was streamed in, by message id (the worker may
 * send several of the model's tokens as one). */
export function streamedPieces(events) {
  const pieces = new Map();
  for (const chunk of chunks(events)) {
    if (!chunk.type?.startsWith("AIMessage") || !chunk.content) continue;
    pieces.set(chunk.id, (pieces.get(chunk.id) ?? 0) + 1);
  }
  return pieces;
}

/** The names of the tool calls the chunks carry, once per call id (a chunk may carry a call as
 * a whole and as its first call chunk). */
export function streamedToolCalls(events) {
  const names = new Map();
  for (const chunk of chunks(events)) {
    for (const call of [...(chunk.tool_calls ?? []), ...(chunk.tool_call_chunks ?? [])]) {
      if (call.name) names.set(call.id, call.name);
    }
  }
  return [...names.values()];
}

export const isChunk = (part) => part.event === "messages" || part.event.startsWith("messages|");

/** AI messages' text in a state's `messages` (content a string or a list of text blocks). */
export function text(message) {
  if (typeof message.content === "string") return message.content;
  return message.content
    .filter((block) => block.type === "text")
    .map((block) => block.text)
    .join("");
}

/** Wait until `check()` resolves to something truthy; that value. */
export async function eventually(check, what, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await check();
    if (last) return last;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${what}: not so after ${timeoutMs} ms (last: ${JSON.stringify(last)})`);
}

export function summary(events) {
  return events.map((e) => `${e.id ?? "-"}:${e.event}`).join(" ");
}
