// AG-UI's own client, @ag-ui/client's HttpAgent, against a real Ferryman server
// (tests/test_ag_ui_js.py starts it): its event verifier sees every event of each run, and any
// event out of the protocol's order fails the run. Text token by token, a tool call with its
// result, an approval ending the run as an interrupt answered through `resume`, and a provider
// retry as a CUSTOM event, and a worker SIGKILLed mid-tool (asked of tests/test_ag_ui_js.py's
// control server, FERRYMAN_CONTROL_URL), the stream going on from the log.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { HttpAgent } from "@ag-ui/client";

const BASE = process.env.FERRYMAN_URL;
const KEY = process.env.FERRYMAN_API_KEY;
const CONTROL = process.env.FERRYMAN_CONTROL_URL;
const HEADERS = { Authorization: `Bearer ${KEY}` };

function agent() {
  return new HttpAgent({ url: `${BASE}/ag-ui/agent`, headers: HEADERS, threadId: randomUUID() });
}

function scripted(script, more = {}) {
  return { ferryman: { model: "scripted", script, ...more } };
}

function say(agent, text) {
  agent.addMessage({ id: randomUUID(), role: "user", content: text });
}

// The run's events as the client's pipeline (verifier included) delivered them; `onEvent`
// sees each as it comes.
async function run(agent, params = {}, onEvent = () => {}) {
  const events = [];
  const result = await agent.runAgent(params, {
    onEvent: ({ event }) => {
      events.push(event);
      onEvent(event);
    },
  });
  assert.equal(events[0].type, "RUN_STARTED");
  assert.ok(["RUN_FINISHED", "RUN_ERROR"].includes(events.at(-1).type));
  return { events, result };
}

const ofType = (events, type) => events.filter((e) => e.type === type);
const text = (events) =>
  ofType(events, "TEXT_MESSAGE_CONTENT")
    .map((e) => e.delta)
    .join("");

async function transcript(threadId) {
  const response = await fetch(`${BASE}/api/agent/${threadId}/transcript?limit=1000`, {
    headers: HEADERS,
  });
  assert.equal(response.status, 200);
  return (await response.json()).events;
}

test("text streams token by token, the resent history is matched, a new agent sent it", async () => {
  const a = agent();
  const answer = "The quick brown fox jumps over the lazy dog.";
  const props = scripted([{ text: answer, chunks: 6, delayMs: 300 }, { text: "Again." }]);
  say(a, "hello");
  const { events } = await run(a, { forwardedProps: props });
  assert.ok(ofType(events, "TEXT_MESSAGE_CONTENT").length > 1);
  assert.equal(text(events), answer);
  assert.deepEqual(
    a.messages.map((m) => [m.role, m.content]),
    [
      ["user", "hello"],
      ["assistant", answer],
    ],
  );
  say(a, "again");
  const second = await run(a);
  assert.equal(text(second.events), "Again.");
  const users = (await transcript(a.threadId)).filter((e) => e.type === "user_message");
  assert.deepEqual(
    users.map((e) => e.data.text),
    ["hello", "again"],
  );
  // A new agent on the thread (a page reloaded) is sent the history first (MESSAGES_SNAPSHOT).
  const fresh = new HttpAgent({ url: `${BASE}/ag-ui/agent`, headers: HEADERS, threadId: a.threadId });
  say(fresh, "fresh");
  const third = await run(fresh);
  assert.equal(third.events[1].type, "MESSAGES_SNAPSHOT");
  assert.deepEqual(
    fresh.messages.map((m) => m.content),
    ["hello", answer, "again", "Again.", "fresh", "You said: fresh"],
  );
});

test("a tool call and its result", async () => {
  const a = agent();
  const call = { name: "put_note", arguments: { key: "k", text: "v" } };
  say(a, "save");
  const { events } = await run(a, {
    forwardedProps: scripted([{ text: "Saving.", toolCalls: [call] }, { text: "Saved." }]),
  });
  const [start] = ofType(events, "TOOL_CALL_START");
  assert.equal(start.toolCallName, "put_note");
  const [result] = ofType(events, "TOOL_CALL_RESULT");
  assert.equal(result.toolCallId, start.toolCallId);
  const assistant = a.messages.find((m) => m.role === "assistant" && m.toolCalls?.length);
  assert.deepEqual(JSON.parse(assistant.toolCalls[0].function.arguments), call.arguments);
  assert.ok(a.messages.some((m) => m.role === "tool" && m.toolCallId === start.toolCallId));
  assert.equal(a.messages.at(-1).content, "Saved.");
});

test("an approval ends the run as an interrupt, answered through resume", async () => {
  const a = agent();
  const call = { name: "put_note", arguments: { key: "a", text: "b" } };
  say(a, "save it");
  const { events } = await run(a, {
    forwardedProps: scripted([{ toolCalls: [call] }, { text: "Done." }], {
      approvalRequired: ["put_note"],
    }),
  });
  const finished = events.at(-1);
  assert.equal(finished.type, "RUN_FINISHED");
  assert.equal(finished.outcome.type, "interrupt");
  const [interrupt] = finished.outcome.interrupts;
  assert.equal(interrupt.reason, "tool_approval");
  assert.deepEqual(
    a.pendingInterrupts.map((i) => i.id),
    [interrupt.id],
  );
  const resumed = await run(a, {
    resume: [{ interruptId: interrupt.id, status: "resolved", payload: { approved: true } }],
  });
  assert.equal(ofType(resumed.events, "TOOL_CALL_RESULT")[0].toolCallId, interrupt.toolCallId);
  assert.equal(text(resumed.events), "Done.");
  assert.equal(resumed.events.at(-1).outcome?.type ?? "success", "success");
  assert.deepEqual(a.pendingInterrupts, []);
});

test("a provider retry is a CUSTOM event named after Ferryman's", async () => {
  const a = agent();
  say(a, "go");
  const { events } = await run(a, {
    forwardedProps: scripted([{ text: "Fine now.", chunks: 3, fault: { kind: "server_error" } }]),
  });
  assert.ok(ofType(events, "CUSTOM").some((e) => e.name === "model_retry"));
  assert.equal(events.at(-1).type, "RUN_FINISHED");
});

test("a worker SIGKILLed mid-tool: the stream goes on from the log", async () => {
  const a = agent();
  say(a, "nap");
  const script = [
    { toolCalls: [{ name: "sleep", arguments: { seconds: 4 } }] },
    { text: "Back again." },
  ];
  let killed;
  const { events } = await run(a, { forwardedProps: scripted(script) }, (event) => {
    if (event.type === "CUSTOM" && event.name === "tool_call_start" && !killed) {
      killed = fetch(`${CONTROL}/kill-worker`, { method: "POST" });
    }
  });
  assert.equal((await killed).status, 200);
  assert.ok(ofType(events, "CUSTOM").some((e) => e.name === "session_resumed"));
  const calls = ofType(events, "TOOL_CALL_START").map((e) => e.toolCallId);
  assert.deepEqual(
    ofType(events, "TOOL_CALL_RESULT").map((e) => e.toolCallId),
    calls,
  );
  assert.equal(text(events), "Back again.");
  assert.equal(events.at(-1).type, "RUN_FINISHED");
});

test("a frontend tool: the run ends waiting for the client's tool message", async () => {
  const a = agent();
  const tool = {
    name: "show_weather",
    description: "Show the weather card for a city in the page.",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  };
  const script = [
    { text: "Showing it.", toolCalls: [{ name: "show_weather", arguments: { city: "Oslo" } }] },
    { text: "Shown." },
  ];
  say(a, "weather in Oslo?");
  const { events } = await run(a, { tools: [tool], forwardedProps: scripted(script) });
  const [start] = ofType(events, "TOOL_CALL_START");
  assert.equal(start.toolCallName, "show_weather");
  assert.deepEqual(ofType(events, "TOOL_CALL_RESULT"), []); // the client runs it
  assert.equal(events.at(-1).type, "RUN_FINISHED");
  const assistant = a.messages.find((m) => m.role === "assistant" && m.toolCalls?.length);
  assert.deepEqual(JSON.parse(assistant.toolCalls[0].function.arguments), { city: "Oslo" });
  // The client runs its tool and sends the result as a `tool` message.
  a.addMessage({ id: randomUUID(), role: "tool", toolCallId: start.toolCallId, content: "sunny" });
  const second = await run(a, { tools: [tool] });
  assert.deepEqual(ofType(second.events, "TOOL_CALL_RESULT"), []); // it has its result
  assert.equal(text(second.events), "Shown.");
  assert.equal(second.events.at(-1).type, "RUN_FINISHED");
  assert.deepEqual(
    a.messages.map((m) => m.role),
    ["user", "assistant", "tool", "assistant"],
  );
  const results = (await transcript(a.threadId)).filter((e) => e.type === "tool_result");
  assert.deepEqual(
    results.map((e) => [e.data.toolCallId, e.data.content, e.data.client]),
    [[start.toolCallId, "sunny", true]],
  );
});
