// Run by tests/test_workbench_chunks.py under node: the workbench's fold (conversation.js) fed
// the frames of a reconnect mid-turn. Prints what it shows as JSON.
const {Conversation} = await import(process.argv[2]);
const c = new Conversation();
const ev = (type, seq, data) => ({type, seq, ts: '2026-12-02T00:00:00.000Z', data});
const chunk = (after, n) => ({type: 'message_delta', afterSeq: after, chunk: n, data: {text: `<${n}>`}});
c.apply(ev('user_message', 1, {text: 'hi', delivery: 'queued'}));
c.apply(ev('session_start', 2, {workerId: 'w1', pid: 1, attempt: 1}));
for (const n of [1, 2, 3]) c.apply(chunk(2, n));
const cursorMidTurn = c.cursor;
// A reconnect from `2` (an event, no fraction) replays every stored chunk, then live ones.
const replayed = [1, 2, 3, 4, 5].map((n) => c.apply(chunk(2, n)));
const draft = c.draft.text;
c.apply(ev('assistant_message', 3, {text: '<1><2><3><4><5>', stopReason: 'stop', toolCalls: []}));
const cursorAfter = c.cursor;
const late = c.apply(chunk(2, 6));
// The next turn numbers from 1 again, after its own event.
c.apply(ev('user_message', 4, {text: 'more', delivery: 'queued'}));
const nextTurn = c.apply(chunk(4, 1));
console.log(JSON.stringify({cursorMidTurn, replayed, draft, cursorAfter, late, nextTurn,
  nextDraft: c.draft.text, texts: c.view.filter((i) => i.kind === 'assistant').map((i) => i.text)}));
