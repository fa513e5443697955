"""AG-UI's view of a session's log, pure: the Agent Protocol's fold (`ThreadFold`: messages,
pending interrupts, the ids derived from log positions) with, for the events of a run, the
AG-UI events each one becomes instead of the LangGraph ones.

A model turn is a step (`STEP_STARTED` at its first token chunk or at its message, whichever
comes first; `STEP_FINISHED` at its message, or at a retry or takeover that abandoned it), its
text one `TEXT_MESSAGE_*` message whose id is the Agent Protocol's AI message id (so the client
holds the same id when it sends its history back), its tool calls `TOOL_CALL_START / ARGS /
END` after the text, each result a `TOOL_CALL_RESULT`. The run's `session_end` is its last
event: `RUN_ERROR` when the session failed, else `RUN_FINISHED` with an interrupt outcome
(the pending approvals and questions) when it waits, a cancelled one when cancelled. A
delegate call's child is a subagent (`SUBAGENT_STARTED`, then `SUBAGENT_FINISHED` or
`SUBAGENT_ERROR` at its end), and a wait on children alone does not end the run
(docs/delegation.md). Every other event is a `CUSTOM` one named after its Ferryman type."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.domain import SessionEventType, Status
from app.protocols.agent_protocol import fold
from app.protocols.agent_protocol.fold import Interrupt, ProtocolEvent

# The events that end an AG-UI run: nothing follows them on its stream.
ENDS = frozenset({"RUN_FINISHED", "RUN_ERROR"})
# Where a run's metadata (kept in the data of the event that opened it) holds what AG-UI sent.
METADATA_KEY = "agUi"
# Events after which a turn that streamed is abandoned (its message never comes).
_ABANDONS = frozenset({SessionEventType.MODEL_RETRY, SessionEventType.SESSION_RESUMED})
_DROPPED_STOPS = frozenset({"aborted", "error"})
# What the API writes as a run opens: the input's answers and messages.
_FROM_API = frozenset(
    {
        SessionEventType.USER_MESSAGE,
        SessionEventType.TOOL_APPROVAL_DECIDED,
        SessionEventType.CLIENT_TOOL_RESULT,
    }
)
# Events the AG-UI client has its own word for already: a client tool's call is the
# TOOL_CALL_* of its message, its result the client's own `tool` message.
_SILENT = frozenset({SessionEventType.CLIENT_TOOL_CALL, SessionEventType.CLIENT_TOOL_RESULT})


def interrupt_view(interrupt: Interrupt) -> dict[str, Any]:
    """An AG-UI 1.0 `Interrupt` (RUN_FINISHED's interrupt outcome) of a pending one."""
    value = interrupt.value
    if interrupt.kind == "approval":
        view: dict[str, Any] = {
            "id": interrupt.id,
            "reason": "tool_approval",
            "message": f"Approve the call of {value.get('name')}?",
            "toolCallId": interrupt.tool_call_id,
            "responseSchema": {
                "type": "object",
                "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
                "required": ["approved"],
            },
        }
    else:
        view = {
            "id": interrupt.id,
            "reason": "question",
            "message": str(value.get("question") or ""),
            "responseSchema": {"type": "string"},
        }
    view["metadata"] = {"ferryman": value}
    return view


def messages_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """AG-UI messages of the fold's (LangChain) ones, for a MESSAGES_SNAPSHOT."""
    out: list[dict[str, Any]] = []
    for message in messages:
        kind, content = message["type"], message.get("content") or ""
        if kind == "human":
            out.append({"id": message["id"], "role": "user", "content": content})
        elif kind == "tool":
            view = {"id": message["id"], "role": "tool", "content": content}
            out.append({**view, "toolCallId": message["tool_call_id"]})
        else:
            view = {"id": message["id"], "role": "assistant", "content": content}
            calls = [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["args"])},
                }
                for call in message.get("tool_calls") or []
            ]
            out.append({**view, "toolCalls": calls} if calls else view)
    return out


@dataclass
class AgUiFold(fold.ThreadFold):
    """The thread's state, and the AG-UI events of a run's log events and token chunks."""

    thread_id: str = ""
    run_id: str = ""  # the client's runId, which RUN_STARTED and RUN_FINISHED echo
    turns: int = 0  # model turns started so far: each step's name
    step: str | None = None  # the open step
    text: str | None = None  # the id of the open text message
    # Every message id the log knows: its own (derived) ones and the ids of the user
    # messages AG-UI sent (kept in the run metadata of the event each run opened with).
    known: set[str] = field(default_factory=set)
    # Whether the run sends a MESSAGES_SNAPSHOT (its client lacks the thread's history).
    snapshot_due: bool = False
    # Calls of client tools without a result in the log, and the results clients posted
    # (content, isError) by call id, the first of each.
    client_calls: set[str] = field(default_factory=set)
    client_posted: dict[str, tuple[str, bool]] = field(default_factory=dict)
    # Delegate calls whose child has not ended (docs/delegation.md): while some are open, a
    # `session_end {waiting}` does not end the run, and the child's end comes in it. The
    # message id of the last reply, which holds the calls.
    delegating: set[str] = field(default_factory=set)
    reply_id: str | None = None

    def apply(self, envelope: dict[str, Any], in_run: bool) -> list[ProtocolEvent]:
        type_ = envelope["type"]
        seq = int(envelope["seq"])
        data = envelope["data"]
        after = self.last_written  # what a turn's chunks followed, before the fold moves it
        streamed = self.streamed.get(after, "")
        snapshot: list[ProtocolEvent] = []
        if in_run and self.snapshot_due and type_ not in _FROM_API:
            # The history up to the run's first event of its own: the messages the run's
            # input posted included, with the log's ids, which the client sends back.
            self.snapshot_due = False
            snapshot.append(("MESSAGES_SNAPSHOT", {"messages": messages_view(self.messages)}))
        super().apply(envelope, in_run=False)
        sent = ((data.get("runMetadata") or {}).get(METADATA_KEY) or {}).get("messageIds")
        if isinstance(sent, list):
            self.known.update(str(i) for i in sent)
        self._client(type_, data)
        self._delegation(type_, data)
        if type_ == SessionEventType.USER_MESSAGE or type_ == SessionEventType.TOOL_RESULT:
            self.known.add(fold.derived(self.session_id, "msg", seq))
        elif type_ == SessionEventType.ASSISTANT_MESSAGE:
            self.known.add(self.ai_id(after))
        if not in_run:
            return []
        return [*snapshot, *self._events(type_, seq, data, after, streamed)]

    def _client(self, type_: str, data: dict[str, Any]) -> None:
        call_id = str(data.get("toolCallId"))
        if type_ == SessionEventType.CLIENT_TOOL_CALL:
            self.client_calls.add(call_id)
        elif type_ == SessionEventType.CLIENT_TOOL_RESULT:
            posted = (str(data.get("content", "")), bool(data.get("isError", False)))
            self.client_posted.setdefault(call_id, posted)
        elif type_ == SessionEventType.TOOL_RESULT:
            self.client_calls.discard(call_id)

    def _delegation(self, type_: str, data: dict[str, Any]) -> None:
        if type_ == SessionEventType.DELEGATE_CALL:
            self.delegating.add(str(data.get("childSessionId")))
        elif type_ == SessionEventType.DELEGATE_RESULT:
            self.delegating.discard(str(data.get("childSessionId")))

    def _subagent(self, type_: str, data: dict[str, Any]) -> ProtocolEvent:
        """A delegate call's child as AG-UI's subagent: started at the call, finished (or
        failed) at the child's end."""
        child = str(data.get("childSessionId"))
        if type_ == SessionEventType.DELEGATE_CALL:
            started: dict[str, Any] = {
                "subagentRunId": child,
                "name": str(data.get("name")),
                "parentToolCallId": str(data.get("toolCallId")),
            }
            if self.reply_id is not None:
                started["parentMessageId"] = self.reply_id
            return ("SUBAGENT_STARTED", started)
        if data.get("status") == Status.SUCCEEDED:
            return ("SUBAGENT_FINISHED", {"subagentRunId": child, "result": data.get("answer")})
        error = data.get("error") or {}
        message = str(error.get("message") or f"the delegated session {data.get('status')}")
        code = str(error.get("code") or str(data.get("status")).upper())
        return ("SUBAGENT_ERROR", {"subagentRunId": child, "message": message, "code": code})

    def _events(
        self, type_: str, seq: int, data: dict[str, Any], after: int, streamed: str
    ) -> list[ProtocolEvent]:
        if type_ == SessionEventType.ASSISTANT_MESSAGE:
            self.reply_id = self.ai_id(after)
            return self._turn_end(after, streamed, data)
        if type_ in (SessionEventType.DELEGATE_CALL, SessionEventType.DELEGATE_RESULT):
            return [self._subagent(type_, data)]
        if (
            type_ == SessionEventType.SESSION_END
            and data.get("status") == Status.WAITING
            and self.delegating
            and not self.pending
        ):
            return self._close()  # waiting on children only: the run goes on with their ends
        if type_ == SessionEventType.TOOL_RESULT:
            # A client's result is its own `tool` message already.
            return [] if data.get("client") else [self._result(seq, data)]
        if type_ in _SILENT:
            return []
        if type_ == SessionEventType.SESSION_END:
            return [*self._close(), self._end(data)]
        if type_ == SessionEventType.USER_MESSAGE:
            return []
        out = self._close() if type_ in _ABANDONS else []
        out.append(("CUSTOM", {"name": str(type_), "value": {"seq": seq, **data}}))
        return out

    def chunk(self, after: int, text: str) -> list[ProtocolEvent]:
        self.streamed[after] = self.streamed.get(after, "") + text
        out = [*self._open_step(), *self._open_text(self.ai_id(after))]
        if text:
            out.append(("TEXT_MESSAGE_CONTENT", {"messageId": self.text, "delta": text}))
        return out

    # --- the parts of a turn -------------------------------------------------------------

    def _open_step(self) -> list[ProtocolEvent]:
        if self.step is not None:
            return []
        self.turns += 1
        self.step = f"turn-{self.turns}"
        return [("STEP_STARTED", {"stepName": self.step})]

    def _open_text(self, message_id: str) -> list[ProtocolEvent]:
        """The text message of the turn that writes `message_id`, if not open."""
        if self.text is not None:
            return []
        self.text = message_id
        return [("TEXT_MESSAGE_START", {"messageId": message_id, "role": "assistant"})]

    def _close(self) -> list[ProtocolEvent]:
        """End the open text message and step (a turn's end, or one abandoned)."""
        out: list[ProtocolEvent] = []
        if self.text is not None:
            out.append(("TEXT_MESSAGE_END", {"messageId": self.text}))
            self.text = None
        if self.step is not None:
            out.append(("STEP_FINISHED", {"stepName": self.step}))
            self.step = None
        return out

    def _turn_end(self, after: int, streamed: str, data: dict[str, Any]) -> list[ProtocolEvent]:
        message_id = self.ai_id(after)
        text = str(data.get("text") or "")
        rest = text[len(streamed) :] if text.startswith(streamed) else text
        out = self._open_step()
        if rest:
            out.extend(self._open_text(message_id))
            out.append(("TEXT_MESSAGE_CONTENT", {"messageId": self.text, "delta": rest}))
        if self.text is not None:
            out.append(("TEXT_MESSAGE_END", {"messageId": self.text}))
            self.text = None
        if data.get("stopReason") not in _DROPPED_STOPS:
            for call in data.get("toolCalls") or []:
                call_id = str(call.get("id"))
                start = {"toolCallId": call_id, "toolCallName": call.get("name")}
                args = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
                out.append(("TOOL_CALL_START", {**start, "parentMessageId": message_id}))
                out.append(("TOOL_CALL_ARGS", {"toolCallId": call_id, "delta": args}))
                out.append(("TOOL_CALL_END", {"toolCallId": call_id}))
        out.extend(self._close())
        return out

    def _result(self, seq: int, data: dict[str, Any]) -> ProtocolEvent:
        content = data.get("content", "")
        return (
            "TOOL_CALL_RESULT",
            {
                "messageId": fold.derived(self.session_id, "msg", seq),
                "toolCallId": str(data.get("toolCallId")),
                "content": content if isinstance(content, str) else json.dumps(content),
                "role": "tool",
            },
        )

    def _end(self, data: dict[str, Any]) -> ProtocolEvent:
        """The run's last event (a session that waits keeps its pending interrupts)."""
        status = data.get("status")
        if status == Status.FAILED:
            error = data.get("error") or {}
            return (
                "RUN_ERROR",
                {
                    "message": str(error.get("message") or "the run failed"),
                    "code": str(error.get("code") or "ERROR"),
                },
            )
        finished: dict[str, Any] = {"threadId": self.thread_id, "runId": self.run_id}
        if status == Status.WAITING and self.pending:
            interrupts = [interrupt_view(i) for i in self.pending.values()]
            finished["outcome"] = {"type": "interrupt", "interrupts": interrupts}
        elif status == Status.CANCELLED:
            finished["outcome"] = {"type": "cancelled"}
        else:
            finished["outcome"] = {"type": "success"}
        return ("RUN_FINISHED", finished)
