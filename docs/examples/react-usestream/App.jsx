// A chat page on Ferryman through the LangGraph SDK's React hook, useStream: the reply streams
// token by token, tool calls show as cards, an agent's question (ask_user) is answered with a
// click, and a page that reloads mid-run rejoins the run's stream where it was.
import { useState } from "react";
import { useStream } from "@langchain/langgraph-sdk/react";

export function App({ apiUrl, apiKey, assistantId, threadId: initialThreadId }) {
  const [threadId, setThreadId] = useState(initialThreadId ?? null);
  const thread = useStream({
    apiUrl, // Ferryman's protocol root: http://127.0.0.1:8000/agent-protocol
    apiKey, // sent as x-api-key; leave it out in local mode
    assistantId, // a stored assistant (POST /agent-protocol/assistants)
    threadId,
    onThreadId: (id) => {
      setThreadId(id);
      rememberThread(id); // so a reload opens the same thread
    },
    // Keep the running run's id in sessionStorage: after a reload (or a server restart) the
    // hook joins its stream again, and Ferryman replays it with no gap and no repeat.
    reconnectOnMount: true,
  });
  const [draft, setDraft] = useState("");

  function send(event) {
    event.preventDefault();
    if (!draft.trim()) return;
    thread.submit({ messages: [{ type: "human", content: draft }] });
    setDraft("");
  }

  return (
    <main>
      <ol className="messages">
        {thread.messages.map((message, index) => (
          <li key={message.id ?? index} className={`message ${message.type}`}>
            {message.type !== "tool" && <p className="text">{textOf(message)}</p>}
            {message.type === "ai" &&
              thread.getToolCalls(message).map(({ call, state, result }) => (
                <div key={call.id} className={`tool-call ${state}`} data-tool={call.name}>
                  <b>{call.name}</b> <code>{JSON.stringify(call.args)}</code>{" "}
                  <span className="state">{state}</span>
                  {result && <pre className="result">{textOf(result)}</pre>}
                </div>
              ))}
          </li>
        ))}
      </ol>
      {thread.interrupt && !thread.isLoading && (
        <Question
          value={thread.interrupt.value}
          answer={(reply) => thread.submit(null, { command: { resume: reply } })}
        />
      )}
      <form onSubmit={send}>
        <input value={draft} onChange={(e) => setDraft(e.target.value)} placeholder="Message" />
        <button type="submit" disabled={thread.isLoading}>
          Send
        </button>
        {thread.isLoading && <span className="busy">streaming…</span>}
        {thread.error && <span className="error">{String(thread.error)}</span>}
      </form>
    </main>
  );
}

// An agent's question: its options as buttons (ask_user's `options`), or a box to type in.
function Question({ value, answer }) {
  const [reply, setReply] = useState("");
  const question = typeof value === "string" ? value : value?.question;
  const options = Array.isArray(value?.options) ? value.options : [];
  return (
    <section className="question">
      <p>{question ?? JSON.stringify(value)}</p>
      {options.map((option) => (
        <button key={option} onClick={() => answer(option)}>
          {option}
        </button>
      ))}
      {options.length === 0 && (
        <form onSubmit={(e) => (e.preventDefault(), answer(reply))}>
          <input value={reply} onChange={(e) => setReply(e.target.value)} />
          <button type="submit">Answer</button>
        </form>
      )}
    </section>
  );
}

function textOf(message) {
  if (typeof message.content === "string") return message.content;
  return message.content
    .filter((part) => part.type === "text")
    .map((part) => part.text)
    .join("");
}

function rememberThread(id) {
  const url = new URL(window.location.href);
  url.searchParams.set("thread", id);
  window.history.replaceState(null, "", url);
}
