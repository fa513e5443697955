"""A session's conversation folded from its events, free of I/O: feed `SessionFold.apply` the
frames of `session_events` (or a transcript's events) in seq order.

A durable event is applied once: one whose seq the fold has passed is ignored, so a stream
that replays after a reconnect, or a transcript read over a stream, changes nothing. Streamed
text (`message_delta`, which has no seq) is a draft until its turn ends: the final
`assistant_message` replaces it, and a retried (`model_retry`) or interrupted turn drops it. A
numbered delta (`chunk`) is applied once too, so a reconnect from an event mid-turn, which
replays the turn's stored chunks, repeats no text; and a delta of a turn that has ended or was
dropped since (its `afterSeq` is older) is stale, so it starts no new draft."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ferryman.models import Event, StreamEvent

Role = Literal["user", "assistant"]
ToolCallStatus = Literal[
    "pending",  # the model asked for it; not started
    "awaiting_approval",
    "approved",  # approved; not started yet
    "running",
    "succeeded",
    "failed",
    "denied",
]
INTERRUPTED = "worker interrupted"


@dataclass(frozen=True)
class Message:
    role: Role
    text: str
    # None while the text still streams (the draft of a turn).
    seq: int | None
    tool_call_ids: tuple[str, ...] = ()
    stop_reason: str | None = None  # assistant: stop, tool_use, length, error, aborted
    delivery: str | None = None  # user: queued or steer

    @property
    def streaming(self) -> bool:
        return self.seq is None


@dataclass(frozen=True)
class DelegateResult:
    """A delegate call's child ended (`delegate_result`): its status, and its final answer or
    its error. The call itself runs on until the parent's next run answers it."""

    status: str
    answer: str | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    status: ToolCallStatus = "pending"
    result: str | None = None  # the tool's content, on success or error
    error: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    # A delegate call's child session (docs/delegation.md): the call runs while it does.
    child_session_id: str | None = None
    delegated: DelegateResult | None = None


@dataclass(frozen=True)
class Compaction:
    """A `session_compacted`: from `seq` on, the model sees `summary` instead of the messages
    through `through_seq` (the fold keeps them all, as the log does)."""

    seq: int
    through_seq: int
    summary: str


@dataclass(frozen=True)
class Conversation:
    """What a fold shows, as one comparable value."""

    messages: tuple[Message, ...]
    tool_calls: tuple[ToolCall, ...]
    status: str | None
    error: dict[str, Any] | None
    question: dict[str, Any] | None
    last_seq: int
    draft: str | None
    compactions: tuple[Compaction, ...] = ()


class SessionFold:
    """The conversation picture of one session. `status` is what the log says (the session
    stream carries no `session_status`): queued after a queued message, running from a start
    or resume, the status of `session_end` after one."""

    def __init__(self, *, status: str | None = None) -> None:
        self.status = status
        self.error: dict[str, Any] | None = None
        self.question: dict[str, Any] | None = None  # a pending `user_question`
        self.last_seq = 0
        self.draft: str | None = None
        self._chunk: tuple[int, int] = (0, 0)  # (afterSeq, chunk) of the last delta applied
        self._turn_ended = 0  # seq of the last event that ended or dropped a turn
        self._messages: list[Message] = []
        self._calls: dict[str, ToolCall] = {}
        self.compactions: list[Compaction] = []

    @property
    def cursor(self) -> int | str:
        """Where a stream of this session goes on from (`session_events`' `after`): the last
        event's seq, and while a turn streams, its chunks held too (`<seq>.<chunk>`, a delta's
        id), so a reconnect sends only the chunks missed."""
        if self.draft is not None and self._chunk[1] > 0:
            return f"{self.last_seq}.{self._chunk[1]}"
        return self.last_seq

    @property
    def messages(self) -> list[Message]:
        """The messages, and the turn streaming now (if any) last."""
        if self.draft is None:
            return list(self._messages)
        return [*self._messages, Message("assistant", self.draft, None)]

    @property
    def tool_calls(self) -> dict[str, ToolCall]:
        """By id, in the order the model asked for them."""
        return dict(self._calls)

    def snapshot(self) -> Conversation:
        return Conversation(
            tuple(self.messages),
            tuple(self._calls.values()),
            self.status,
            self.error,
            self.question,
            self.last_seq,
            self.draft,
            tuple(self.compactions),
        )

    def apply(self, event: StreamEvent | Event) -> bool:
        """Fold in one frame; whether the picture changed. Control frames and durable events
        already applied change nothing."""
        seq = _seq(event)
        if seq is None:
            if event.type != "message_delta":
                return False
            after = _envelope(event).get("afterSeq")
            if isinstance(after, int) and after < self._turn_ended:
                return False  # its turn is over
            chunk = _chunk(event)
            if chunk is not None:
                if chunk <= self._chunk:
                    return False  # replayed: a reconnect from an event resends the turn's
                self._chunk = chunk
            self.draft = (self.draft or "") + str(event.data.get("text", ""))
            return True
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            handler(self, seq, event.data)
        return True

    def apply_all(self, events: list[StreamEvent] | list[Event]) -> bool:
        changed = False
        for event in events:
            changed = self.apply(event) or changed
        return changed

    # --- one method per durable event type -------------------------------------------------

    def _user_message(self, seq: int, data: Mapping[str, Any]) -> None:
        delivery = str(data.get("delivery", "queued"))
        self._messages.append(Message("user", str(data.get("text", "")), seq, delivery=delivery))
        self.question = None
        if delivery == "queued":
            self.status = "queued"

    def _end_turn(self, seq: int) -> None:
        """The draft goes (replaced, retried or cut off), and deltas after an earlier event."""
        self.draft = None
        self._turn_ended = seq

    def _started(self, seq: int, data: Mapping[str, Any]) -> None:
        self._end_turn(seq)
        self.status, self.error = "running", None

    def _resumed(self, seq: int, data: Mapping[str, Any]) -> None:
        self._started(seq, data)
        # Each call the dead worker left without a result was answered "worker interrupted".
        repaired = data.get("repairedToolCalls", data.get("repairedToolCallIds")) or []
        for call_id in map(str, repaired):
            call = self._calls.get(call_id, ToolCall(call_id, ""))
            self._calls[call_id] = replace(
                call, status="failed", error=INTERRUPTED, interrupted=True
            )

    def _assistant_message(self, seq: int, data: Mapping[str, Any]) -> None:
        self._end_turn(seq)
        calls = [c for c in data.get("toolCalls") or [] if isinstance(c, Mapping)]
        for call in calls:
            call_id = str(call.get("id", ""))
            if call_id not in self._calls:
                name, arguments = str(call.get("name", "")), dict(call.get("arguments") or {})
                self._calls[call_id] = ToolCall(call_id, name, arguments)
        text = str(data.get("text") or "")
        if text or calls:
            ids = tuple(str(c.get("id", "")) for c in calls)
            stop = data.get("stopReason")
            self._messages.append(Message("assistant", text, seq, ids, stop))

    def _call(self, data: Mapping[str, Any]) -> ToolCall:
        call_id = str(data.get("toolCallId", ""))
        default = ToolCall(call_id, str(data.get("name", "")), dict(data.get("arguments") or {}))
        return self._calls.get(call_id, default)

    def _set_call(self, call: ToolCall, **changes: Any) -> None:
        self._calls[call.id] = replace(call, **changes)

    def _tool_call_start(self, seq: int, data: Mapping[str, Any]) -> None:
        self._set_call(self._call(data), status="running")

    def _delegate_call(self, seq: int, data: Mapping[str, Any]) -> None:
        child = str(data.get("childSessionId") or "") or None
        self._set_call(self._call(data), status="running", child_session_id=child)

    def _delegate_result(self, seq: int, data: Mapping[str, Any]) -> None:
        answer = data.get("answer")
        error = data.get("error")
        delegated = DelegateResult(
            str(data.get("status", "")),
            None if answer is None else str(answer),
            dict(error) if isinstance(error, Mapping) else None,
        )
        child = str(data.get("childSessionId") or "") or None
        self._set_call(self._call(data), child_session_id=child, delegated=delegated)

    def _tool_result(self, seq: int, data: Mapping[str, Any]) -> None:
        content = str(data.get("content", ""))
        status: ToolCallStatus = "succeeded"
        if data.get("denied"):
            status = "denied"
        elif data.get("isError"):
            status = "failed"
        self._set_call(
            self._call(data),
            status=status,
            result=content,
            error=content if status != "succeeded" else None,
            timed_out=bool(data.get("timedOut")),
            interrupted=bool(data.get("interrupted")),
        )

    def _approval_requested(self, seq: int, data: Mapping[str, Any]) -> None:
        self._set_call(self._call(data), status="awaiting_approval")

    def _approval_decided(self, seq: int, data: Mapping[str, Any]) -> None:
        call = self._call(data)
        if data.get("approved"):
            self._set_call(call, status="approved")
        else:
            self._set_call(call, status="denied", error=str(data.get("reason") or "denied"))
        if self.status == "waiting":
            self.status = "queued"  # a decision re-queues a waiting session

    def _user_question(self, seq: int, data: Mapping[str, Any]) -> None:
        self.question = dict(data)

    def _turn_dropped(self, seq: int, data: Mapping[str, Any]) -> None:
        self._end_turn(seq)

    def _compacted(self, seq: int, data: Mapping[str, Any]) -> None:
        through = int(data.get("throughSeq", 0))
        self.compactions.append(Compaction(seq, through, str(data.get("summary", ""))))

    def _session_end(self, seq: int, data: Mapping[str, Any]) -> None:
        self._end_turn(seq)
        self.status = str(data.get("status", self.status))
        error = data.get("error")
        self.error = dict(error) if isinstance(error, Mapping) else None


_Handler = Callable[[SessionFold, int, Mapping[str, Any]], None]
_HANDLERS: dict[str, _Handler] = {
    "user_message": SessionFold._user_message,
    "session_start": SessionFold._started,
    "session_resumed": SessionFold._resumed,
    "assistant_message": SessionFold._assistant_message,
    "tool_call_start": SessionFold._tool_call_start,
    "delegate_call": SessionFold._delegate_call,
    "delegate_result": SessionFold._delegate_result,
    "tool_result": SessionFold._tool_result,
    "tool_approval_requested": SessionFold._approval_requested,
    "tool_approval_decided": SessionFold._approval_decided,
    "user_question": SessionFold._user_question,
    "model_retry": SessionFold._turn_dropped,
    "session_interrupted": SessionFold._turn_dropped,
    "session_end": SessionFold._session_end,
    "session_compacted": SessionFold._compacted,
}


def _seq(event: StreamEvent | Event) -> int | None:
    """The seq of a durable session event; None for ephemeral and control frames."""
    if isinstance(event, StreamEvent) and not event.durable:
        return None
    return event.seq


def _envelope(event: StreamEvent | Event) -> Mapping[str, Any]:
    return event.envelope if isinstance(event, StreamEvent) else event.model_extra or {}


def _chunk(event: StreamEvent | Event) -> tuple[int, int] | None:
    """(afterSeq, chunk) of a numbered token delta, which orders a session's deltas."""
    envelope = _envelope(event)
    after, chunk = envelope.get("afterSeq"), envelope.get("chunk")
    if isinstance(after, int) and isinstance(chunk, int):
        return after, chunk
    return None
