// The SSE parser (src/sse.ts) over a body cut into arbitrary pieces: the frames are the same
// whatever the cuts, whichever line ends; comments and `retry:` blocks dispatch nothing.
import assert from "node:assert/strict";
import test from "node:test";
import fc from "fast-check";
import { SseParser } from "../dist/index.js";

const BODY = [
  "retry: 2000",
  "",
  "id: 42",
  "event: session_status",
  'data: {"id":"42","type":"session_status"}',
  "",
  ": ping",
  "",
  "event: caught_up",
  'data: {"replayed":1,',
  'data: "cursor":"42"}',
  "",
  "id: 7.3",
  "event: message_delta",
  "data:no space",
  "",
];
const EXPECTED = [
  { event: "session_status", data: '{"id":"42","type":"session_status"}', id: "42", retry: null },
  { event: "caught_up", data: '{"replayed":1,\n"cursor":"42"}', id: null, retry: null },
  { event: "message_delta", data: "no space", id: "7.3", retry: null },
];

function parse(text, cuts) {
  const parser = new SseParser();
  const frames = [];
  let start = 0;
  for (const cut of [...cuts].sort((a, b) => a - b)) {
    frames.push(...parser.feed(text.slice(start, cut)));
    start = cut;
  }
  frames.push(...parser.feed(text.slice(start)));
  return frames;
}

test("frames are the same whatever the cuts and line ends", () => {
  fc.assert(
    fc.property(fc.constantFrom("\n", "\r\n", "\r"), fc.array(fc.nat(400), { maxLength: 12 }), (end, cuts) => {
      const text = BODY.join(end) + end;
      assert.deepEqual(parse(text, cuts.map((c) => c % (text.length + 1))), EXPECTED);
    }),
    // A repeated cut (an empty piece) once lost a `\r\n` split across it: always tried.
    { numRuns: 500, examples: [["\r\n", [140, 140]]] },
  );
});
