// Every REST operation of /api against a real server (keys mode), and problems as typed errors
// carrying `status` and `code`.
import assert from "node:assert/strict";
import { createServer } from "node:net";
import test from "node:test";
import {
  AuthenticationError,
  ConflictError,
  Ferryman,
  FerrymanConnectionError,
  FerrymanError,
  NotFoundError,
  SessionFold,
  UnprocessableEntityError,
} from "../dist/index.js";
import { KEY, SKIP, URL, direct, terminal, until } from "./harness.mjs";

test("sessions: create, list, get, rename, messages, transcript, cancel, delete", { skip: SKIP }, async () => {
  const client = direct();
  const body = { prompt: "hello", title: "ts one", script: [{ text: "Hi there." }, { text: "Again." }] };
  const key = `ts-${Date.now()}`;
  const made = await client.createSession(body, { idempotencyKey: key });
  assert.equal((await client.createSession(body, { idempotencyKey: key })).id, made.id);
  await assert.rejects(client.createSession({ ...body, prompt: "other" }, { idempotencyKey: key }), (error) => {
    assert.ok(error instanceof ConflictError && error instanceof FerrymanError);
    assert.deepEqual([error.status, error.code], [409, "IDEMPOTENCY_KEY_REUSED"]);
    return true;
  });
  assert.equal((await client.getSession(made.id)).title, "ts one");
  assert.equal((await client.renameSession(made.id, "ts renamed")).title, "ts renamed");
  const page = await client.listSessions({ limit: 1 });
  assert.equal(page.sessions.length, 1);
  assert.match(page.cursor, /^\d+$/);
  const all = [];
  for await (const session of client.iterSessions()) all.push(session.id);
  assert.ok(all.includes(made.id));
  await terminal(client, made.id);
  const accepted = await client.sendMessage(made.id, "and again?");
  assert.deepEqual([accepted.id, accepted.message.delivery], [made.id, "queued"]);
  const ended = await terminal(client, made.id);
  assert.equal(ended.status, "succeeded");
  const events = [];
  for await (const event of client.iterTranscript(made.id)) events.push(event);
  assert.deepEqual(events.map((e) => e.seq), events.map((_, i) => i + 1));
  assert.equal((await client.transcript(made.id, { after: 1, limit: 1 })).events[0].seq, 2);
  await assert.rejects(client.cancelSession(made.id), (error) => {
    assert.ok(error instanceof ConflictError);
    assert.deepEqual([error.status, error.code], [409, "SESSION_ALREADY_TERMINAL"]);
    return true;
  });
  const idle = await client.createSession({ title: "idle" });
  const cancelled = await client.cancelSession(idle.id, { wait: true });
  assert.equal(cancelled.status, "cancelled");
  await client.deleteSession(made.id);
  await assert.rejects(client.getSession(made.id), (error) => {
    assert.ok(error instanceof NotFoundError);
    assert.deepEqual([error.status, error.code], [404, "SESSION_NOT_FOUND"]);
    return true;
  });
});

test("approvals, tools and problems with fields", { skip: SKIP }, async () => {
  const client = direct();
  const tools = await client.listTools();
  assert.ok(tools.tools.some((tool) => tool.name === "put_note"), JSON.stringify(tools));
  const session = await client.createSession({
    prompt: "note it",
    approvalRequired: ["put_note"],
    script: [{ toolCalls: [{ name: "put_note", arguments: { key: "k", text: "v" } }] }, { text: "Noted." }],
  });
  await until(async () => (await client.getSession(session.id)).status === "waiting", 30_000, "the approval");
  const { events } = await client.transcript(session.id);
  const asked = events.find((e) => e.type === "tool_approval_requested");
  const callId = asked.data.toolCallId;
  const decided = await client.decideToolCall(session.id, callId, true);
  assert.equal(decided.id, session.id);
  await assert.rejects(client.decideToolCall(session.id, callId, false, "late"), (error) => {
    assert.ok(error instanceof ConflictError);
    assert.equal(error.code, "APPROVAL_NOT_PENDING");
    return true;
  });
  assert.equal((await terminal(client, session.id)).status, "succeeded");
  await assert.rejects(client.renameSession(session.id, ""), (error) => {
    assert.ok(error instanceof UnprocessableEntityError);
    assert.deepEqual([error.status, error.code], [422, "VALIDATION_ERROR"]);
    assert.equal(error.errors[0].field, "title");
    assert.match(error.message, /^422 VALIDATION_ERROR: .*title/);
    return true;
  });
  await assert.rejects(client.getSession("../../healthz"), NotFoundError);
});

test("assistants: create, list, get, update, versions, a session of one, delete", { skip: SKIP }, async () => {
  const client = direct();
  const name = `ts-assistant-${Date.now()}`;
  const assistant = await client.createAssistant({ name, model: "scripted", instructions: "Be brief.", metadata: { team: "ts" } });
  assert.equal((await client.getAssistant(assistant.id)).name, name);
  const listed = await client.listAssistants({ name, metadata: { team: "ts" } });
  assert.deepEqual(listed.assistants.map((a) => a.id), [assistant.id]);
  const updated = await client.updateAssistant(assistant.id, { instructions: "Be briefer." });
  assert.equal(updated.version, 2);
  const versions = await client.assistantVersions(assistant.id);
  assert.deepEqual(versions.versions.map((v) => v.version).sort(), [1, 2]);
  const session = await client.createSession({ assistantId: assistant.id, assistantVersion: 1, prompt: "hi", script: [{ text: "ok" }] });
  assert.equal((await terminal(client, session.id)).status, "succeeded");
  await client.deleteAssistant(assistant.id);
  await assert.rejects(client.getAssistant(assistant.id), (error) => error instanceof NotFoundError && error.code === "ASSISTANT_NOT_FOUND");
});

test("fork and edit, retry from a message, compact", { skip: SKIP }, async () => {
  const client = direct();
  const note = (i) => ({ text: `turn ${i}`, toolCalls: [{ name: "put_note", arguments: { key: `k${i}`, text: "x" } }], summary: `notes k0..k${i}` });
  // No script: the scripted model answers "You said: <the last user message>".
  const parent = await client.createSession({ prompt: "hello" });
  const long = await client.createSession({ prompt: "save two", script: [note(0), note(1), { text: "saved" }] });
  assert.equal((await terminal(client, parent.id)).status, "succeeded");
  const texts = async (id) => {
    const events = [];
    for await (const event of client.iterTranscript(id)) events.push(event);
    return events.filter((e) => e.type === "assistant_message").map((e) => e.data.text);
  };
  // An edit of the prompt: answered anew.
  const edited = await client.forkSession(parent.id, { atSeq: 1, message: "say hi", title: "ts fork" });
  assert.deepEqual([edited.status, edited.title, edited.forkedFrom], ["queued", "ts fork", { sessionId: parent.id, seq: 1 }]);
  // A retry: the fork at the user message answers it again.
  const retried = await client.forkSession(parent.id, { atSeq: 1 });
  assert.deepEqual([retried.status, retried.forkedFrom], ["queued", { sessionId: parent.id, seq: 1 }]);
  assert.equal((await terminal(client, retried.id)).status, "succeeded");
  assert.deepEqual(await texts(retried.id), ["You said: hello"]);
  await assert.rejects(client.forkSession(parent.id, { atSeq: 10_000 }), (error) => {
    assert.ok(error instanceof UnprocessableEntityError);
    assert.equal(error.code, "FORK_SEQ_OUT_OF_RANGE");
    return true;
  });
  // A finished session is queued for a compaction, writes it, and settles as it was.
  assert.equal((await terminal(client, long.id)).status, "succeeded");
  const asked = await client.compactSession(long.id);
  assert.deepEqual([asked.id, asked.status], [long.id, "queued"]);
  assert.ok(Number.isInteger(asked.seq));
  assert.equal((await terminal(client, long.id)).status, "succeeded"); // queued since the 202
  const fold = new SessionFold();
  for await (const event of client.iterTranscript(long.id)) fold.apply(event);
  assert.deepEqual(fold.compactions.map((c) => [c.summary, c.model]), [["notes k0..k0", "scripted"]]);
  assert.ok(fold.compactions[0].seq > asked.seq && fold.compactions[0].throughSeq < asked.seq);
  assert.deepEqual(fold.messages.filter((m) => m.role === "assistant").map((m) => m.text), ["turn 0", "turn 1", "saved"]);
  const idle = await client.createSession({ title: "idle" });
  await assert.rejects(client.compactSession(idle.id), (error) => error instanceof ConflictError && error.code === "SESSION_NOT_COMPACTABLE");
  assert.equal((await terminal(client, edited.id)).status, "succeeded");
  assert.deepEqual(await texts(edited.id), ["You said: say hi"]);
});

test("a wrong key and an unreachable server", { skip: SKIP }, async () => {
  const wrong = new Ferryman({ baseUrl: URL, apiKey: `${KEY}x` });
  await assert.rejects(wrong.listSessions(), (error) => {
    assert.ok(error instanceof AuthenticationError);
    assert.deepEqual([error.status, error.code], [401, "INVALID_API_KEY"]);
    assert.equal(error.retryable, false);
    return true;
  });
  const closed = await new Promise((resolve) => {
    const server = createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
  const nowhere = new Ferryman({ baseUrl: `http://127.0.0.1:${closed}`, apiKey: KEY });
  await assert.rejects(nowhere.listSessions(), (error) => {
    assert.ok(error instanceof FerrymanConnectionError);
    assert.equal(error.message, `cannot reach Ferryman at http://127.0.0.1:${closed}: ECONNREFUSED; is \`ferryman serve\` running? (FERRYMAN_URL)`);
    return true;
  });
});
