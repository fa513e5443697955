// A page on @ferryman/client (docs/typescript.md): the owner's sessions, live
// (OwnerSessionClient), one session's conversation token by token (SessionFold over its
// stream), a form that starts a session and a cancel button (409 taken as "ended already").
import { useEffect, useMemo, useState } from "react";
import { Ferryman, OwnerSessionClient, SessionFold } from "@ferryman/client";

// The owner's sessions, live; `live` for its calls (live.cancel takes 409 as terminal).
export function useOwnerSessions(ferryman) {
  const [state, setState] = useState({ sessions: [], connected: false, healthy: true, live: null });
  useEffect(() => {
    const live = new OwnerSessionClient(ferryman, {
      onChange: (c) => setState({ sessions: [...c.sessions.values()], connected: c.connected, healthy: c.healthy, live: c }),
    });
    live.start().catch((error) => console.error(error));
    return () => void live.close();
  }, [ferryman]);
  return state;
}

// One session's conversation, token by token.
export function useConversation(ferryman, sessionId) {
  const [conversation, setConversation] = useState(null);
  useEffect(() => {
    if (!sessionId) return undefined;
    const stop = new AbortController();
    const fold = new SessionFold();
    (async () => {
      for await (const event of ferryman.sessionEvents(sessionId, { signal: stop.signal })) {
        if (fold.apply(event)) setConversation(fold.snapshot());
      }
    })().catch((error) => console.error(error));
    return () => stop.abort();
  }, [ferryman, sessionId]);
  return conversation;
}

function Conversation({ conversation }) {
  if (!conversation) return <p className="empty">Pick a session.</p>;
  return (
    <section className="conversation" data-status={conversation.status ?? ""}>
      <p className="status">{conversation.status}</p>
      <ul className="messages">
        {conversation.messages.map((m, i) => (
          <li key={m.seq ?? `draft-${i}`} className={`message ${m.role}${m.seq === null ? " streaming" : ""}`}>
            <span className="text">{m.text}</span>
          </li>
        ))}
      </ul>
      <ul className="tool-calls">
        {conversation.toolCalls.map((call) => (
          <li key={call.id} className="tool-call" data-tool={call.name} data-status={call.status}>
            {call.name}: {call.status}
            {call.interrupted ? " (worker interrupted)" : ""}
          </li>
        ))}
      </ul>
    </section>
  );
}

export function App({ baseUrl, apiKey }) {
  const ferryman = useMemo(() => new Ferryman({ baseUrl, apiKey }), [baseUrl, apiKey]);
  const { sessions, connected, healthy, live } = useOwnerSessions(ferryman);
  const [selected, setSelected] = useState(null);
  const [error, setError] = useState(null);
  const conversation = useConversation(ferryman, selected);

  async function start(event) {
    event.preventDefault();
    const form = new FormData(event.currentTarget);
    try {
      const session = await ferryman.createSession({
        prompt: String(form.get("prompt")),
        model: "scripted",
        script: [{ text: String(form.get("reply")), chunks: 6, delayMs: 3000 }],
      });
      setSelected(session.id);
    } catch (failure) {
      setError(`${failure.code ?? ""} ${failure.message}`);
    }
  }

  return (
    <main>
      <p className="connection">{connected ? "live" : healthy ? "reconnecting" : "offline"}</p>
      <form onSubmit={start}>
        <input name="prompt" placeholder="Prompt" required />
        <input name="reply" placeholder="The scripted reply" required />
        <button type="submit">Start</button>
      </form>
      {error && <p className="error">{error}</p>}
      <ul className="sessions">
        {sessions.map((s) => (
          <li key={s.id} className="session" data-id={s.id} data-status={s.status}>
            <button type="button" onClick={() => setSelected(s.id)}>
              {s.title}
            </button>
            <span className="session-status">{s.status}</span>
            <button
              type="button"
              className="cancel"
              onClick={() => live?.cancel(s.id).catch((failure) => setError(`${failure.code ?? ""} ${failure.message}`))}
            >
              Cancel
            </button>
          </li>
        ))}
      </ul>
      <Conversation conversation={conversation} />
    </main>
  );
}
