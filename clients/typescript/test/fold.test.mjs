// SessionFold (src/fold.ts), pure: fast-check properties over generated session logs (replays
// and duplicates change nothing; a resume fails exactly its repaired calls; a stream's fold
// ends as a transcript's), as tests/test_session_fold.py has them for the Python fold.
import assert from "node:assert/strict";
import test from "node:test";
import fc from "fast-check";
import { INTERRUPTED, SessionFold, StreamEvent } from "../dist/index.js";

const TS = "2025-01-01T00:00:00.000Z";
const RUNS = { numRuns: 300 };

function durable(seq, type, data) {
  const envelope = { id: String(seq), type, sessionId: "s1", ownerId: "o1", ts: TS, seq, attempt: 1, data, phase: "live" };
  return new StreamEvent(type, String(seq), envelope);
}

function delta(text) {
  return new StreamEvent("message_delta", null, { type: "message_delta", sessionId: "s1", ownerId: "o1", ts: TS, data: { text } });
}

function caughtUp(cursor) {
  return new StreamEvent("caught_up", null, { replayed: cursor, fromEventId: "0", cursor: String(cursor) });
}

const words = fc.string({ unit: fc.constantFrom("a", "b", "c", " "), maxLength: 4 });
const STEPS = ["start", "turn", "tool", "approval", "delegate", "crash", "end", "message", "question", "retry", "compact"];

// A log as a list of steps, each drawing what it needs: fast-check shrinks it as a whole.
const step = fc.record({
  kind: fc.constantFrom(...STEPS),
  texts: fc.array(words, { maxLength: 3 }),
  text: words,
  n: fc.nat(2),
  pick: fc.nat(100),
  picks: fc.uniqueArray(fc.nat(20), { maxLength: 4 }),
  flags: fc.tuple(fc.boolean(), fc.boolean(), fc.boolean()),
  choice: fc.nat(3),
});

function build(first, steps) {
  const frames = [];
  const calls = [];
  let seq = 0;
  const add = (type, data) => frames.push(durable(++seq, type, data));
  const stream = (texts) => frames.push(...texts.map(delta));
  const pick = (s) => calls[s.pick % calls.length];
  add("user_message", { text: first, delivery: "queued" });
  for (const s of steps) {
    const [a, b, c] = s.flags;
    switch (s.kind) {
      case "start":
        add("session_start", { workerId: "w", pid: 1, attempt: 1 });
        break;
      case "turn": {
        stream(s.texts);
        const ids = Array.from({ length: s.n }, (_, i) => `call_${calls.length + i}`);
        calls.push(...ids);
        const toolCalls = ids.map((id) => ({ id, name: "put_note", arguments: { key: id } }));
        const stopReason = ids.length ? "tool_use" : ["stop", "length", "aborted"][s.choice % 3];
        add("assistant_message", { text: s.text, toolCalls, stopReason });
        break;
      }
      case "tool": {
        if (!calls.length) break;
        const id = pick(s);
        add("tool_call_start", { toolCallId: id, name: "put_note", arguments: {} });
        if (a) add("tool_result", { toolCallId: id, name: "put_note", isError: b, content: s.text, ...(b && c ? { timedOut: true } : {}) });
        break;
      }
      case "approval": {
        if (!calls.length) break;
        const id = pick(s);
        add("tool_approval_requested", { toolCallId: id, name: "put_note", arguments: {} });
        if (a) add("tool_approval_decided", { toolCallId: id, approved: b });
        break;
      }
      case "delegate": {
        // A delegate call's child, its end (delegate_result), then the parent's answer.
        if (!calls.length) break;
        const id = pick(s);
        const child = `child_${id}`;
        add("delegate_call", { toolCallId: id, name: "agent__helper", arguments: { task: s.text }, assistantId: "a1", childSessionId: child });
        if (!a) break;
        const status = ["succeeded", "failed", "cancelled"][s.choice % 3];
        const end = status === "succeeded" ? { answer: s.text } : status === "failed" ? { error: { code: "X", message: "m" } } : {};
        add("delegate_result", { toolCallId: id, childSessionId: child, status, ...end });
        if (b) add("tool_result", { toolCallId: id, name: "agent__helper", isError: status !== "succeeded", content: s.text });
        break;
      }
      case "crash": {
        stream(s.texts.slice(0, 2));
        if (a) add("session_interrupted", { reason: "shutdown" });
        const repaired = calls.length ? [...new Set(s.picks.map((i) => calls[i % calls.length]))] : [];
        add("session_resumed", { reason: "crash", attempt: 2, repairedToolCalls: repaired });
        break;
      }
      case "end": {
        const status = ["succeeded", "failed", "cancelled", "waiting"][s.choice];
        add("session_end", status === "failed" ? { status, error: { code: "X", message: "m" } } : { status });
        break;
      }
      case "message":
        add("user_message", { text: s.text, delivery: a ? "queued" : "steer" });
        break;
      case "question":
        add("user_question", { question: s.text });
        break;
      case "compact":
        add("session_compacted", { throughSeq: Math.max(1, seq - s.n), summary: s.text, tokensBefore: 900, tokensAfter: 100, model: "scripted" });
        break;
      case "retry":
        stream(s.texts.length ? s.texts.slice(0, 2) : ["x"]);
        add("model_retry", { attempt: 1, delayMs: 10, reason: "server_error" });
        break;
    }
  }
  return frames;
}

const logs = fc.tuple(words, fc.array(step, { maxLength: 14 })).map(([first, steps]) => build(first, steps));

function fold(frames) {
  const folding = new SessionFold();
  for (const frame of frames) folding.apply(frame);
  return folding.snapshot();
}

const durableOnly = (frames) => frames.filter((f) => f.id !== null);

test("each durable event twice is once", () => {
  fc.assert(
    fc.property(logs, (frames) => {
      const doubled = frames.flatMap((f) => (f.id !== null ? [f, f] : [f]));
      assert.deepEqual(fold(doubled), fold(frames));
    }),
    RUNS,
  );
});

test("a reconnect that replays changes nothing", () => {
  fc.assert(
    fc.property(logs, fc.nat(), fc.nat(), (frames, x, y) => {
      // Seen up to k, then a reconnect from an older cursor replays the durable events from j
      // (deltas are never replayed), with a caught_up, then the rest.
      const k = x % (frames.length + 1);
      const j = y % (k + 1);
      const replay = [...frames.slice(0, k), ...durableOnly(frames.slice(j, k)), caughtUp(k), ...frames.slice(k)];
      assert.deepEqual(fold(replay), fold(frames));
    }),
    RUNS,
  );
});

test("any prefix twice is once", () => {
  fc.assert(
    fc.property(logs, fc.nat(), (frames, x) => {
      const prefix = durableOnly(frames).slice(0, x % (frames.length + 1));
      const folding = new SessionFold();
      folding.applyAll(prefix);
      const once = folding.snapshot();
      assert.equal(folding.applyAll(prefix), false, "a repeat reported a change");
      assert.deepEqual(folding.snapshot(), once);
    }),
    RUNS,
  );
});

test("a stream folds as its transcript", () => {
  fc.assert(
    fc.property(logs, (frames) => {
      // Deltas only ever show a draft: without it, the picture is the transcript's.
      const streamed = fold(frames);
      const logged = fold(durableOnly(frames).map((f) => f.event()));
      assert.deepEqual(streamed.messages.filter((m) => m.seq !== null), logged.messages);
      assert.deepEqual(
        [streamed.toolCalls, streamed.status, streamed.lastSeq, streamed.compactions],
        [logged.toolCalls, logged.status, logged.lastSeq, logged.compactions],
      );
      if (frames.length && frames.at(-1).id !== null) assert.equal(streamed.draft, null);
    }),
    RUNS,
  );
});

test("a resume fails exactly its repaired calls", () => {
  fc.assert(
    fc.property(logs, fc.uniqueArray(fc.nat(30), { maxLength: 5 }), (frames, picks) => {
      const before = fold(frames);
      const known = [...before.toolCalls.map((c) => c.id), "call_unknown"];
      const repaired = [...new Set(picks.map((i) => known[i % known.length]))];
      const resumed = durable(before.lastSeq + 1, "session_resumed", { reason: "crash", repairedToolCalls: repaired });
      const after = fold([...frames, resumed]);
      const callsBefore = new Map(before.toolCalls.map((c) => [c.id, c]));
      const callsAfter = new Map(after.toolCalls.map((c) => [c.id, c]));
      assert.deepEqual(new Set(callsAfter.keys()), new Set([...callsBefore.keys(), ...repaired]));
      for (const [id, call] of callsAfter) {
        if (repaired.includes(id)) assert.deepEqual([call.status, call.error, call.interrupted], ["failed", INTERRUPTED, true]);
        else assert.deepEqual(call, callsBefore.get(id));
      }
      assert.deepEqual([after.status, after.draft], ["running", null]);
    }),
    RUNS,
  );
});

test("numbered deltas replayed after a reconnect repeat no text", () => {
  fc.assert(
    fc.property(fc.array(words, { minLength: 1, maxLength: 8 }), fc.nat(), (texts, x) => {
      const chunk = (i) => new StreamEvent("message_delta", `1.${i + 1}`, { type: "message_delta", afterSeq: 1, chunk: i + 1, data: { text: texts[i] } });
      const all = texts.map((_, i) => chunk(i));
      const k = x % (all.length + 1);
      const folding = new SessionFold();
      folding.applyAll([durable(1, "session_start", {}), ...all.slice(0, k), ...all]);
      assert.equal(folding.draft, texts.join(""));
    }),
    RUNS,
  );
});

test("streamed text is replaced by the final message", () => {
  const folding = new SessionFold();
  folding.apply(durable(1, "user_message", { text: "hi", delivery: "queued" }));
  assert.equal(folding.status, "queued");
  folding.apply(durable(2, "session_start", { workerId: "w", pid: 1, attempt: 1 }));
  for (const text of ["Hel", "lo"]) assert.ok(folding.apply(delta(text)));
  assert.deepEqual(folding.messages.map((m) => [m.role, m.text, m.seq]), [["user", "hi", 1], ["assistant", "Hello", null]]);
  folding.apply(durable(3, "assistant_message", { text: "Hello!", stopReason: "stop" }));
  folding.apply(durable(4, "session_end", { status: "succeeded" }));
  assert.deepEqual(folding.messages.map((m) => [m.role, m.text, m.seq]), [["user", "hi", 1], ["assistant", "Hello!", 3]]);
  assert.deepEqual([folding.status, folding.draft, folding.lastSeq], ["succeeded", null, 4]);
});

test("tool calls go through their states", () => {
  const folding = new SessionFold();
  const call = { id: "c1", name: "put_note", arguments: { key: "k" } };
  folding.apply(durable(1, "user_message", { text: "note", delivery: "queued" }));
  folding.apply(durable(2, "session_start", {}));
  folding.apply(durable(3, "assistant_message", { text: "", toolCalls: [call], stopReason: "tool_use" }));
  const states = [folding.toolCalls.get("c1").status];
  folding.apply(durable(4, "tool_approval_requested", { toolCallId: "c1", name: "put_note" }));
  folding.apply(durable(5, "session_end", { status: "waiting" }));
  states.push(folding.toolCalls.get("c1").status);
  folding.apply(durable(6, "tool_approval_decided", { toolCallId: "c1", approved: true }));
  states.push(folding.toolCalls.get("c1").status);
  assert.equal(folding.status, "queued");
  folding.apply(durable(7, "session_resumed", { repairedToolCalls: [] }));
  folding.apply(durable(8, "tool_call_start", { toolCallId: "c1", name: "put_note" }));
  states.push(folding.toolCalls.get("c1").status);
  folding.apply(durable(9, "tool_result", { toolCallId: "c1", name: "put_note", isError: false, content: "saved" }));
  const done = folding.toolCalls.get("c1");
  assert.deepEqual([...states, done.status], ["pending", "awaiting_approval", "approved", "running", "succeeded"]);
  assert.deepEqual([done.name, done.arguments, done.result, done.error], ["put_note", { key: "k" }, "saved", null]);
  assert.deepEqual(folding.messages.at(-1).toolCallIds, ["c1"]);
});

test("a delegate call runs with its child until the parent answers it", () => {
  const folding = new SessionFold();
  const call = { id: "c1", name: "agent__researcher", arguments: { task: "look" } };
  folding.apply(durable(1, "user_message", { text: "plan", delivery: "queued" }));
  folding.apply(durable(2, "session_start", {}));
  folding.apply(durable(3, "assistant_message", { text: "", toolCalls: [call], stopReason: "tool_use" }));
  const made = { toolCallId: "c1", name: call.name, arguments: call.arguments, assistantId: "a1", childSessionId: "s2" };
  folding.apply(durable(4, "delegate_call", made));
  folding.apply(durable(5, "session_end", { status: "waiting" }));
  const waiting = folding.toolCalls.get("c1");
  assert.deepEqual([waiting.status, waiting.childSessionId, waiting.delegated], ["running", "s2", null]);
  folding.apply(durable(6, "delegate_result", { toolCallId: "c1", childSessionId: "s2", status: "succeeded", answer: "found" }));
  const ended = folding.toolCalls.get("c1");
  assert.deepEqual([ended.status, ended.delegated], ["running", { status: "succeeded", answer: "found", error: null }]);
  folding.apply(durable(7, "session_resumed", { repairedToolCalls: [] }));
  folding.apply(durable(8, "tool_result", { toolCallId: "c1", name: call.name, isError: false, content: "found" }));
  const done = folding.toolCalls.get("c1");
  assert.deepEqual([done.status, done.result, done.childSessionId, done.name], ["succeeded", "found", "s2", call.name]);
});

test("every delegate call keeps its child, whatever comes after", () => {
  fc.assert(
    fc.property(logs, (frames) => {
      // Whatever follows (a resume that repairs the call, its result, a replay), a call keeps
      // the child its delegate_call named, and shows the child's end once it came.
      const made = new Map(durableOnly(frames).filter((f) => f.type === "delegate_call").map((f) => [f.data.toolCallId, f.data.childSessionId]));
      const shown = fold(frames);
      for (const call of shown.toolCalls) assert.equal(call.childSessionId, made.get(call.id) ?? null);
      const ended = new Set(durableOnly(frames).filter((f) => f.type === "delegate_result").map((f) => f.data.toolCallId));
      for (const call of shown.toolCalls) assert.equal(call.delegated !== null, ended.has(call.id));
    }),
    RUNS,
  );
});

test("a delta of a turn that ended or was dropped is stale; the cursor holds a turn's chunks", () => {
  const chunk = (after, n, text) => new StreamEvent("message_delta", `${after}.${n}`, { type: "message_delta", afterSeq: after, chunk: n, data: { text } });
  const folding = new SessionFold();
  folding.apply(durable(1, "session_start", { workerId: "w", pid: 1, attempt: 1 }));
  folding.applyAll([chunk(1, 1, "Half "), chunk(1, 2, "an ans")]);
  assert.equal(folding.cursor, "1.2");
  folding.apply(durable(2, "model_retry", { attempt: 1, delayMs: 10 }));
  assert.equal(folding.cursor, 2);
  assert.equal(folding.apply(chunk(1, 3, "late")), false, "a chunk of the retried turn");
  assert.equal(folding.draft, null);
  assert.ok(folding.apply(chunk(2, 1, "Whole")));
  folding.apply(durable(3, "assistant_message", { text: "Whole", stopReason: "stop" }));
  assert.equal(folding.apply(chunk(2, 2, " late")), false, "a chunk after its final message");
  assert.deepEqual([folding.draft, folding.cursor, folding.messages.map((m) => m.text)], [null, 3, ["Whole"]]);
});

test("a compaction is listed and every message before it kept", () => {
  fc.assert(
    fc.property(logs, words, fc.nat(), (frames, summary, x) => {
      const before = fold(frames);
      const through = 1 + (x % Math.max(1, before.lastSeq));
      const data = { throughSeq: through, summary, tokensBefore: 1200, tokensAfter: 300, model: "scripted", usage: null };
      const after = fold([...frames, durable(before.lastSeq + 1, "session_compacted", data)]);
      // The fold keeps every message: the summary replaces them only in what the model sees.
      assert.deepEqual(after.messages, before.messages);
      assert.deepEqual([after.toolCalls, after.status, after.question, after.draft], [before.toolCalls, before.status, before.question, before.draft]);
      const { usage, ...shown } = data;
      assert.deepEqual(after.compactions, [...before.compactions, { seq: before.lastSeq + 1, ...shown }]);
    }),
    RUNS,
  );
});
