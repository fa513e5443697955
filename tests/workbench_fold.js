// Run in the page by tests/test_workbench.py: conversation.js (the chat's items over the
// package's SessionFold) fed synthetic logs.
// (The page evaluates this file's function; the test strips these comment lines.)
async () => {
  const {Conversation, interruptedLabel} = await import('/assets/conversation.js');
  const c = new Conversation();
  let seq = 0;
  const ev = (type, data) => ({type, seq: ++seq, ts: '2026-12-01T00:00:00.000Z', data});
  const call = (id, name, args = {}) => ({id, name, arguments: args});
  c.apply(ev('user_message', {text: 'hi', delivery: 'queued'}));
  c.apply(ev('session_start', {workerId: 'w1', pid: 1, attempt: 1}));
  c.apply({type: 'message_delta', afterSeq: 2, data: {text: 'Half an ans'}});
  c.apply(ev('model_retry', {attempt: 1, delayMs: 1500, reason: 'rate_limited', message: 'busy'}));
  const afterRetry = c.view.filter((i) => i.kind === 'assistant').length;
  c.apply({type: 'message_delta', afterSeq: 2, data: {text: 'stale'}});  // before the retry
  c.apply({type: 'message_delta', afterSeq: 3, data: {text: 'Two calls'}});
  const draft = c.draft && c.draft.text;
  c.apply(ev('assistant_message', {text: 'Two calls', stopReason: 'tool_use',
    toolCalls: [call('a', 'sleep', {seconds: 9}), call('b', 'slow'), call('c', 'put_note')]}));
  c.apply(ev('tool_call_start', {toolCallId: 'a', name: 'sleep', arguments: {seconds: 9}}));
  c.apply(ev('tool_result', {toolCallId: 'a', name: 'sleep', isError: true, timedOut: true, content: 'timed out'}));
  c.apply(ev('tool_call_start', {toolCallId: 'b', name: 'slow', arguments: {}}));
  c.apply({type: 'message_delta', afterSeq: 7, data: {text: 'never finished'}});
  // The worker dies in `b`; the next one repairs it alone and resumes.
  c.apply(ev('tool_result', {toolCallId: 'b', name: 'slow', isError: true, interrupted: true, content: 'worker interrupted'}));
  const replayed = c.apply({...c.events[3]});
  c.apply(ev('session_resumed', {workerId: 'w2', pid: 2, attempt: 2, reason: 'crash',
    transcriptMessages: 3, repairedToolCalls: ['b']}));
  const state = (id) => [c.calls.get(id).status, c.calls.get(id).cause];
  const markers = c.items.filter((i) => i.kind === 'marker').map((i) => i.text);
  const texts = c.view.filter((i) => i.kind === 'assistant').map((i) => i.text);
  // A follow-up after the run finished: a new run, never announced as a resume.
  c.apply(ev('assistant_message', {text: 'Done', stopReason: 'stop', toolCalls: []}));
  c.apply(ev('session_end', {status: 'succeeded'}));
  c.apply(ev('user_message', {text: 'one more thing', delivery: 'queued'}));
  c.apply(ev('session_resumed', {workerId: 'w3', pid: 3, attempt: 3, reason: 'follow_up',
    transcriptMessages: 6, repairedToolCalls: []}));
  const last = c.items.filter((i) => i.kind === 'marker').at(-1);
  return {
    afterRetry, draft, replayed,
    a: state('a'), b: state('b'), c: state('c'), label: interruptedLabel(c.calls.get('b').cause),
    draftAfterResume: c.draft,
    markers,
    texts,
    followUp: [last.tone, last.text],
  };
}
