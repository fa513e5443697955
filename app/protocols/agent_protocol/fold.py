"""The Agent Protocol's view of a session's log, pure: ids derived from log positions, the
thread's state (LangChain message dicts, pending interrupts, checkpoints) folded from its
events, the runs its log is made of, and the protocol events each log event of a run becomes.

Everything here is a function of the durable log, so every API process derives the same run
ids, checkpoint ids, interrupt ids and stream event ids, before and after a restart:

- run id: uuid5 of the session id and the seq of the event that opened the run;
- checkpoint id: the UUID whose integer is the seq of the state's last event;
- interrupt id: uuid5 of the session id and the seq of the question or approval request;
- message id: uuid5 of the session id and the seq of its event (an AI message: of the last event
  its run wrote before it, which its streamed token chunks know before the message exists);
- stream event id: `<seq>-<j>`, the j-th protocol event (0, 1, ...) made of log event `seq`,
  counted over every stream mode so that the ids do not depend on the modes asked for; a token
  chunk streamed after log event `seq` is `<seq>.<k>` (its k-th, from 1).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from app.domain import SessionEventType, Status

_NS = uuid.UUID("3f9c1a52-6f0e-4c1b-9a57-2d3c0e8b7a11")

# Session status -> thread status (docs/langgraph.md).
THREAD_STATUS: dict[str, str] = {
    "idle": "idle",
    Status.QUEUED: "busy",
    Status.RUNNING: "busy",
    Status.WAITING: "interrupted",
    Status.SUCCEEDED: "idle",
    Status.CANCELLED: "idle",
    Status.FAILED: "error",
}
SESSION_STATUSES: dict[str, list[str]] = {}
for _session, _thread in THREAD_STATUS.items():
    SESSION_STATUSES.setdefault(_thread, []).append(str(_session))

# session_end status -> run status.
RUN_STATUS = {
    Status.SUCCEEDED: "success",
    Status.FAILED: "error",
    Status.CANCELLED: "interrupted",
    Status.WAITING: "interrupted",
}

# Stream modes and the SSE event each gives; metadata, error and end always go out.
MODE_EVENTS = {
    "values": "values",
    "updates": "updates",
    "messages-tuple": "messages",
    "events": "events",
    "custom": "custom",
}
ALWAYS = frozenset({"metadata", "error", "end"})
# The modes the protocol names that Ferryman takes but has nothing for (docs/langgraph.md).
SILENT_MODES = frozenset({"messages", "debug", "tasks", "checkpoints", "tools", "lifecycle"})
DEFAULT_MODES = ("values",)
ALL_EVENTS = frozenset(MODE_EVENTS.values()) | ALWAYS

# API-written events: they open or steer runs, they are not what a run wrote.
_FROM_API = frozenset(
    {
        SessionEventType.USER_MESSAGE,
        SessionEventType.TOOL_APPROVAL_DECIDED,
        SessionEventType.CLIENT_TOOL_RESULT,
    }
)
# Assistant messages the model never sees again (the resume plan strips them).
_DROPPED_STOPS = frozenset({"aborted", "error"})
_NODE = "agent"


def derived(session_id: uuid.UUID, kind: str, seq: int) -> str:
    return str(uuid.uuid5(_NS, f"{session_id}:{kind}:{seq}"))


def run_id(session_id: uuid.UUID, start_seq: int) -> str:
    return derived(session_id, "run", start_seq)


def checkpoint_id(seq: int) -> str:
    return str(uuid.UUID(int=seq))


def checkpoint_seq(raw: str) -> int | None:
    """The seq a checkpoint id names, or None if it is not one of ours."""
    try:
        return uuid.UUID(raw).int
    except (ValueError, AttributeError, TypeError):
        return None


Position = tuple[int, int, int]  # (seq, 0 for a log event's own events | 1 for chunks, j | k)


def event_id(position: Position) -> str:
    seq, chunk, index = position
    return f"{seq}.{index}" if chunk else f"{seq}-{index}"


def parse_event_id(raw: str | None) -> Position | None:
    """A Last-Event-ID of ours, or None (absent or not ours: replay from the run's start)."""
    if not raw:
        return None
    for sep, chunk in (("-", 0), (".", 1)):
        head, found, tail = raw.strip().partition(sep)
        if found and head.isdigit() and tail.isdigit() and len(head) < 19 and len(tail) < 19:
            return int(head), chunk, int(tail)
    return None


@dataclass(frozen=True)
class Run:
    """A run: the span of the log from the event that opened it (a message or a decision
    that found no run open) to the `session_end` that settled it (None while open)."""

    id: str
    start_seq: int
    end_seq: int | None
    status: str
    created_at: Any
    updated_at: Any
    # What the run's create gave it (kept in the data of the event that opened it).
    metadata: dict[str, Any] | None = None
    multitask_strategy: str | None = None


def _run(
    session_id: uuid.UUID, start: dict[str, Any], end: dict[str, Any] | None, status: str
) -> Run:
    return Run(
        run_id(session_id, start["seq"]),
        start["seq"],
        end["seq"] if end else None,
        status,
        start["created_at"],
        (end or start)["created_at"],
        start.get("run_metadata"),
        start.get("multitask_strategy"),
    )


def runs_of(session_id: uuid.UUID, marks: list[dict[str, Any]], session_status: str) -> list[Run]:
    """The runs of a log, oldest first, from its run marks (`store.threads.run_marks`)."""
    runs: list[Run] = []
    start: dict[str, Any] | None = None
    for mark in marks:
        if mark["type"] == SessionEventType.SESSION_END:
            if start is not None:
                runs.append(_run(session_id, start, mark, RUN_STATUS.get(mark["status"], "error")))
                start = None
        elif start is None:
            start = mark
    if start is not None:
        status = "running" if session_status == Status.RUNNING else "pending"
        runs.append(_run(session_id, start, None, status))
    return runs


@dataclass
class Interrupt:
    id: str
    seq: int
    kind: Literal["question", "approval"]
    value: dict[str, Any]
    tool_call_id: str | None = None

    def view(self) -> dict[str, Any]:
        return {"value": self.value, "id": self.id}


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    messages: int  # how many of the fold's messages the state has
    interrupts: tuple[Interrupt, ...]
    created_at: str | None
    step: int


ProtocolEvent = tuple[str, Any]


@dataclass
class ThreadFold:
    """The thread's state folded from its log, event by event (`apply`), and, for the events
    of a run, the protocol events each one becomes."""

    session_id: uuid.UUID
    model: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    pending: dict[str, Interrupt] = field(default_factory=dict)  # by interrupt id
    checkpoints: list[Checkpoint] = field(default_factory=list)
    last_seq: int = 0
    last_written: int = 0  # the last event a run wrote (what token chunks follow)
    settled: int = 0  # the last turn end (message or retry): later chunks follow it
    streamed: dict[int, str] = field(default_factory=dict)  # chunk text, by event followed
    run: str | None = None
    tool_names: dict[str, str] = field(default_factory=dict)

    # --- state ---------------------------------------------------------------------------

    def values(self, upto: Checkpoint | None = None) -> dict[str, Any]:
        point = upto if upto is not None else self.head()
        if point is None:
            return {"messages": []}
        values: dict[str, Any] = {"messages": self.messages[: point.messages]}
        if point.interrupts:
            values["__interrupt__"] = [i.view() for i in point.interrupts]
        return values

    def head(self) -> Checkpoint | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def _checkpoint(self, seq: int, ts: str | None) -> None:
        self.checkpoints.append(
            Checkpoint(
                seq, len(self.messages), tuple(self.pending.values()), ts, len(self.checkpoints)
            )
        )

    def ai_id(self, after: int) -> str:
        return derived(self.session_id, "ai", after)

    # --- events --------------------------------------------------------------------------

    def apply(self, envelope: dict[str, Any], in_run: bool) -> list[ProtocolEvent]:
        """Fold one log event in; with `in_run`, the protocol events it becomes (all modes)."""
        type_ = envelope["type"]
        seq = int(envelope["seq"])
        data = envelope["data"]
        ts = envelope.get("ts")
        self.last_seq = seq
        written_before = self.last_written
        if type_ not in _FROM_API:
            self.last_written = seq
        out: list[ProtocolEvent] = []
        changed = False
        if type_ == SessionEventType.USER_MESSAGE:
            self.messages.append(self._human(seq, str(data.get("text", ""))))
            self.pending = {k: i for k, i in self.pending.items() if i.kind != "question"}
            changed = True
        elif type_ == SessionEventType.ASSISTANT_MESSAGE:
            out.extend(self._assistant(written_before, data, in_run))
            changed = data.get("stopReason") not in _DROPPED_STOPS
        elif type_ == SessionEventType.TOOL_CALL_START:
            self.tool_names[str(data.get("toolCallId"))] = str(data.get("name", ""))
            if in_run:
                out.append(("events", self._tool_event("on_tool_start", data)))
        elif type_ == SessionEventType.TOOL_RESULT:
            message = self._tool(seq, data)
            self.messages.append(message)
            self._answered(str(data.get("toolCallId")))
            if in_run:
                out.append(("updates", {"tools": {"messages": [message]}}))
                out.append(("messages", [message, self._meta("tools")]))
                out.append(("events", self._tool_event("on_tool_end", data, message)))
            changed = True
        elif type_ in (SessionEventType.USER_QUESTION, SessionEventType.TOOL_APPROVAL_REQUESTED):
            interrupt = self._interrupt(seq, type_, data)
            self.pending[interrupt.id] = interrupt
            if in_run:
                out.append(("updates", {"__interrupt__": [interrupt.view()]}))
            changed = True
        elif type_ == SessionEventType.TOOL_APPROVAL_DECIDED:
            self._answered(str(data.get("toolCallId")))
            if in_run:
                out.append(("custom", _custom(type_, seq, data)))
        elif type_ == SessionEventType.SESSION_END:
            status = data.get("status")
            if status != Status.WAITING:
                self.pending = {}
            if in_run and status == Status.FAILED:
                error = data.get("error") or {}
                out.append(
                    (
                        "error",
                        {
                            "error": error.get("code", "ERROR"),
                            "message": error.get("message", "the run failed"),
                        },
                    )
                )
            if in_run:
                out.append(("end", {"run_id": self.run, "status": RUN_STATUS.get(status)}))
        else:
            if type_ == SessionEventType.MODEL_RETRY:
                self.settled = seq
            if in_run:
                out.append(("custom", _custom(type_, seq, data)))
        if changed:
            self._checkpoint(seq, ts)
            if in_run:
                # After this event's updates: the state it made.
                at = 0 if type_ == SessionEventType.USER_MESSAGE else len(out)
                out.insert(at, ("values", self.values()))
        return out

    def chunk(self, after: int, text: str) -> list[ProtocolEvent]:
        """The protocol events of a token chunk streamed after log event `after`."""
        self.streamed[after] = self.streamed.get(after, "") + text
        chunk = _ai_chunk(self.ai_id(after), text)
        return [
            ("messages", [chunk, self._meta("model")]),
            ("events", self._model_event("on_chat_model_stream", {"chunk": chunk})),
        ]

    def _assistant(self, after: int, data: dict[str, Any], in_run: bool) -> list[ProtocolEvent]:
        """`after`: the last event its run wrote before it, which its chunks followed."""
        self.settled = self.last_seq
        text = str(data.get("text") or "")
        calls = [
            {
                "name": call.get("name"),
                "args": call.get("arguments") or {},
                "id": call.get("id"),
                "type": "tool_call",
            }
            for call in data.get("toolCalls") or []
        ]
        usage = data.get("usage")
        usage_metadata = (
            {
                "input_tokens": usage.get("inputTokens", 0),
                "output_tokens": usage.get("outputTokens", 0),
                "total_tokens": usage.get("inputTokens", 0) + usage.get("outputTokens", 0),
            }
            if isinstance(usage, dict)
            else None
        )
        stop = data.get("stopReason")
        message_id = self.ai_id(after)
        message: dict[str, Any] = {
            "type": "ai",
            "content": text,
            "id": message_id,
            "tool_calls": calls,
            "invalid_tool_calls": [],
            "usage_metadata": usage_metadata,
            "additional_kwargs": {},
            "response_metadata": {"finish_reason": stop},
            "name": None,
            "example": False,
        }
        streamed = self.streamed.pop(after, "")
        if stop not in _DROPPED_STOPS:
            self.messages.append(message)
        if not in_run:
            return []
        # The text not streamed yet: the whole of it unless chunks went out on this stream.
        rest = text[len(streamed) :] if text.startswith(streamed) else text
        final = _ai_chunk(message_id, rest)
        final["tool_call_chunks"] = [
            {
                "name": call["name"],
                "args": json.dumps(call["args"]),
                "id": call["id"],
                "index": index,
                "type": "tool_call_chunk",
            }
            for index, call in enumerate(calls)
        ]
        final["tool_calls"] = calls
        final["response_metadata"] = {"finish_reason": stop}
        final["usage_metadata"] = usage_metadata
        if stop in _DROPPED_STOPS:
            return [("messages", [final, self._meta("model")])]
        return [
            ("updates", {"model": {"messages": [message]}}),
            ("messages", [final, self._meta("model")]),
            ("events", self._model_event("on_chat_model_end", {"output": message})),
        ]

    def _human(self, seq: int, text: str) -> dict[str, Any]:
        return {
            "type": "human",
            "content": text,
            "id": derived(self.session_id, "msg", seq),
            "additional_kwargs": {},
            "response_metadata": {},
            "name": None,
            "example": False,
        }

    def _tool(self, seq: int, data: dict[str, Any]) -> dict[str, Any]:
        content = data.get("content", "")
        call_id = str(data.get("toolCallId"))
        return {
            "type": "tool",
            "content": content if isinstance(content, str) else json.dumps(content),
            "tool_call_id": call_id,
            "name": data.get("name") or self.tool_names.get(call_id),
            "id": derived(self.session_id, "msg", seq),
            "status": "error" if data.get("isError") else "success",
            "artifact": None,
            "additional_kwargs": {},
            "response_metadata": {},
        }

    def _interrupt(self, seq: int, type_: str, data: dict[str, Any]) -> Interrupt:
        iid = derived(self.session_id, "interrupt", seq)
        if type_ == SessionEventType.USER_QUESTION:
            value = {"type": "question", "question": data.get("question")}
            if data.get("options"):
                value["options"] = data["options"]
            return Interrupt(iid, seq, "question", value)
        value = {
            "type": "approval",
            "toolCallId": data.get("toolCallId"),
            "name": data.get("name"),
            "arguments": data.get("arguments"),
        }
        return Interrupt(iid, seq, "approval", value, str(data.get("toolCallId")))

    def _answered(self, call_id: str) -> None:
        self.pending = {k: i for k, i in self.pending.items() if i.tool_call_id != call_id}

    def _meta(self, node: str) -> dict[str, Any]:
        return {
            "run_id": self.run,
            "thread_id": str(self.session_id),
            "langgraph_node": node,
            "langgraph_step": len(self.checkpoints),
            "ls_model_name": self.model,
        }

    def _model_event(self, name: str, data: dict[str, Any]) -> dict[str, Any]:
        return {
            "event": name,
            "name": self.model,
            "run_id": self.run,
            "data": data,
            "metadata": self._meta("model"),
            "tags": [],
            "parent_ids": [],
        }

    def _tool_event(
        self, name: str, data: dict[str, Any], message: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        call_id = str(data.get("toolCallId"))
        payload: dict[str, Any] = (
            {"input": data.get("arguments")} if message is None else {"output": message}
        )
        return {
            "event": name,
            "name": data.get("name") or self.tool_names.get(call_id),
            "run_id": call_id,
            "data": payload,
            "metadata": self._meta("tools"),
            "tags": [],
            "parent_ids": [],
        }


def _custom(type_: str, seq: int, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, "seq": seq, "data": data}


def _ai_chunk(message_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "AIMessageChunk",
        "content": text,
        "id": message_id,
        "tool_calls": [],
        "tool_call_chunks": [],
        "invalid_tool_calls": [],
        "additional_kwargs": {},
        "response_metadata": {},
        "usage_metadata": None,
        "name": None,
        "example": False,
    }


def wanted_events(modes: Iterable[str]) -> frozenset[str]:
    """The SSE events a stream sends for the stream modes asked for."""
    return frozenset(MODE_EVENTS[m] for m in modes if m in MODE_EVENTS) | ALWAYS
