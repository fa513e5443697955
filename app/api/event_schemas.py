"""The streams' frames as schemas, for the OpenAPI document only: SDK authors type what they parse
from them. The server never validates its events against these (they are written by the store
and the runtime, and sent as stored); tests check that what it sends fits them.

A session stream's `data:` is a `SessionEvent`, a `MessageDelta`, `CaughtUp` or
`ResyncRequired`; an owner stream's an `OwnerEvent`, `CaughtUp` or `ResyncRequired`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, Union, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, create_model

from app.api.schemas import DateTime, EventId, Session, SessionError, Uuid
from app.domain import OwnerEventType, SessionEventType, Status


class Data(BaseModel):
    # Newer servers may add fields: clients must ignore what they do not know.
    model_config = ConfigDict(extra="allow")


# --- what each event's `data` holds ------------------------------------------------------------


class SessionCreatedData(Data):
    session: Session


class SessionStatusData(Data):
    status: Status
    attempt: int
    resumes: int | None = Field(
        default=None, description="When a claim starts a run: the session's takeovers so far."
    )
    error: SessionError | None = Field(default=None, description="When `failed`.")


class SessionTitleData(Data):
    title: str


class SessionActiveStageData(Data):
    stage: str | None = Field(description='`"model"`, `"tool:<name>"`, or null when idle.')


class SessionCancelRequestedData(Data):
    requestedAt: DateTime


class SessionResumedData(Data):
    workerId: str
    pid: int
    attempt: int
    reason: Literal["crash", "shutdown", "follow_up"]
    transcriptMessages: int
    repairedToolCalls: list[str] = Field(
        description="The tool calls left without a result, now answered as interrupted."
    )


class SessionDeletedData(Data):
    pass


class OpensRun(Data):
    """What an Agent Protocol run create gave the run the event opens (docs/langgraph.md)."""

    runMetadata: dict[str, Any] | None = Field(
        default=None, description="The run's `metadata`, when its create gave one."
    )
    multitaskStrategy: Literal["reject", "interrupt", "enqueue"] | None = Field(
        default=None, description="The run create's `multitask_strategy`."
    )


class UserMessageData(OpensRun):
    text: str
    delivery: Literal["steer", "queued"]


class SessionStartData(Data):
    workerId: str
    pid: int
    attempt: int


class ToolCallData(Data):
    id: str
    name: str
    arguments: dict[str, Any]
    invalidArguments: str | None = Field(
        default=None, description="Arguments the model sent that are not a JSON object, as sent."
    )


class UsageData(Data):
    inputTokens: int
    outputTokens: int
    cachedTokens: int


class AssistantMessageData(Data):
    text: str
    toolCalls: list[ToolCallData]
    stopReason: Literal["stop", "tool_use", "length", "error", "aborted"]
    usage: UsageData | None = None


class ToolCallStartData(Data):
    toolCallId: str
    name: str
    arguments: dict[str, Any]


class ToolResultData(Data):
    toolCallId: str
    name: str
    isError: bool
    content: str
    interrupted: bool | None = Field(default=None, description="A worker died during the call.")
    timedOut: bool | None = None
    denied: bool | None = Field(default=None, description="A person denied the call.")
    client: bool | None = Field(
        default=None, description="The result the client posted for a call of its tool."
    )


class UserQuestionData(Data):
    question: str
    options: list[str] | None = None


class ModelRetryData(Data):
    attempt: int
    delayMs: int
    reason: str = Field(description="The fault: rate_limited, server_error, truncated, ...")
    message: str


class ModelWaitData(Data):
    reason: Literal["concurrency", "rpm", "tpm", "paused"] = Field(
        description="What the model call waits on: a free slot of the provider's concurrent"
        " calls, its requests or tokens per minute, or a pause its 429 asked for"
        " (docs/budgets.md)"
    )
    untilMs: int | None = Field(
        default=None,
        description="When the call tries again (Unix milliseconds); absent for a slot,"
        " which frees when some call ends",
    )


class ToolApprovalRequestedData(Data):
    toolCallId: str
    name: str
    arguments: dict[str, Any]


class ToolApprovalDecidedData(OpensRun):
    toolCallId: str
    approved: bool
    reason: str | None = None


class ClientToolCallData(Data):
    toolCallId: str
    name: str
    arguments: dict[str, Any]


class ClientToolResultData(OpensRun):
    toolCallId: str
    content: str
    isError: bool


class DelegateCallData(ClientToolCallData):
    """A call of a delegate (docs/delegation.md): its child session was made with it."""

    assistantId: Uuid = Field(description="The assistant the child runs.")
    childSessionId: Uuid = Field(description="The child session, `parent` of which is this call.")


class DelegateResultData(Data):
    """The child's end, written by its final transaction: the run answers the call with it."""

    toolCallId: str
    childSessionId: Uuid
    status: Status = Field(description="succeeded, failed or cancelled.")
    answer: str | None = Field(default=None, description="When succeeded: its final answer.")
    error: SessionError | None = None


class SessionInterruptedData(Data):
    reason: str = Field(description='`"shutdown"`: the worker handed the session over.')


class SessionEndData(Data):
    status: Status
    error: SessionError | None = None
    note: str | None = None


class SessionCompactedData(Data):
    """From here on the model sees the session's instructions, this summary and the events
    after `throughSeq` (docs/compaction.md). Nothing is deleted from the log."""

    throughSeq: int = Field(description="The last seq the summary stands for.")
    summary: str
    tokensBefore: int = Field(description="The estimated tokens of the request before.")
    tokensAfter: int = Field(description="The estimated tokens of the request after.")
    model: str = Field(description="The model that wrote the summary.")
    usage: UsageData | None = Field(
        default=None, description="The summarizing call's own tokens (in the session's usage)."
    )


class CompactionRequestedData(Data):
    """POST /api/agent/{id}/compact: the session compacts at its run's next step."""


class MessageDeltaData(Data):
    text: str


# --- envelopes ---------------------------------------------------------------------------------


class EventPhase(StrEnum):
    """`backlog`: sent from the log on (re)connect; `live`: as it happened."""

    BACKLOG = "backlog"
    LIVE = "live"


class Envelope(BaseModel):
    sessionId: Uuid
    ownerId: str
    ts: DateTime
    phase: EventPhase


class DurableEnvelope(Envelope):
    id: EventId = Field(description="The event's id, also its SSE `id:`.")


class SessionEnvelope(DurableEnvelope):
    seq: int = Field(description="The session's event number: 1, 2, 3, ... with no gap.")
    attempt: int


def _event(name: str, base: type[BaseModel], type_: str, data: type[Data]) -> type[BaseModel]:
    literal = cast(Any, Literal)[type_]
    return create_model(name, __base__=base, type=(literal, ...), data=(data, ...))


_OWNER_DATA: dict[OwnerEventType, type[Data]] = {
    OwnerEventType.SESSION_CREATED: SessionCreatedData,
    OwnerEventType.SESSION_STATUS: SessionStatusData,
    OwnerEventType.SESSION_TITLE: SessionTitleData,
    OwnerEventType.SESSION_ACTIVE_STAGE: SessionActiveStageData,
    OwnerEventType.SESSION_CANCEL_REQUESTED: SessionCancelRequestedData,
    OwnerEventType.SESSION_RESUMED: SessionResumedData,
    OwnerEventType.SESSION_DELETED: SessionDeletedData,
}
_SESSION_DATA: dict[SessionEventType, type[Data]] = {
    SessionEventType.USER_MESSAGE: UserMessageData,
    SessionEventType.SESSION_START: SessionStartData,
    SessionEventType.SESSION_RESUMED: SessionResumedData,
    SessionEventType.ASSISTANT_MESSAGE: AssistantMessageData,
    SessionEventType.TOOL_CALL_START: ToolCallStartData,
    SessionEventType.TOOL_RESULT: ToolResultData,
    SessionEventType.USER_QUESTION: UserQuestionData,
    SessionEventType.MODEL_RETRY: ModelRetryData,
    SessionEventType.MODEL_WAIT: ModelWaitData,
    SessionEventType.TOOL_APPROVAL_REQUESTED: ToolApprovalRequestedData,
    SessionEventType.TOOL_APPROVAL_DECIDED: ToolApprovalDecidedData,
    SessionEventType.CLIENT_TOOL_CALL: ClientToolCallData,
    SessionEventType.CLIENT_TOOL_RESULT: ClientToolResultData,
    SessionEventType.SESSION_INTERRUPTED: SessionInterruptedData,
    SessionEventType.SESSION_END: SessionEndData,
    SessionEventType.SESSION_COMPACTED: SessionCompactedData,
    SessionEventType.COMPACTION_REQUESTED: CompactionRequestedData,
    SessionEventType.DELEGATE_CALL: DelegateCallData,
    SessionEventType.DELEGATE_RESULT: DelegateResultData,
}


def _pascal(type_: str) -> str:
    return "".join(word.capitalize() for word in type_.split("_"))


# Owner events are named `Owner...Event` where a session event has the same type.
_OWNER_EVENTS = [
    _event(f"Owner{_pascal(t)}Event", DurableEnvelope, t, data) for t, data in _OWNER_DATA.items()
]
_SESSION_EVENTS = [
    _event(f"{_pascal(t)}Event", SessionEnvelope, t, data) for t, data in _SESSION_DATA.items()
]


class MessageDelta(Envelope):
    """Ephemeral: streamed text of the turn in progress, never in the transcript. Its `id:` is
    `<seq>.<chunk>` (seq: the last durable event before it on the stream, normally `afterSeq`):
    a reconnect with it as `Last-Event-ID` gets the turn's chunks after this one, then goes
    live. A cursor, not an event: no envelope `id`, and no durable event has it."""

    type: Literal["message_delta"]
    afterSeq: int = Field(
        description="The seq of the durable event this text follows: it comes after that "
        "event and before the next (a turn's text, after its tool results)."
    )
    chunk: int = Field(
        ge=1,
        description="Its number among the deltas that follow `afterSeq`: 1, 2, 3... A client "
        "that has chunk k drops a chunk numbered k or less (a replay).",
    )
    data: MessageDeltaData


class CaughtUp(BaseModel):
    """Control frame (no `id:`): the backlog is sent (on a session stream, with the stored token
    chunks of a turn still open at its cursor); live events follow."""

    replayed: int
    fromEventId: EventId
    cursor: EventId


class ResyncRequired(BaseModel):
    """Control frame (no `id:`): the cursor cannot be resumed; take a fresh list snapshot and
    stream from its `cursor`."""

    reason: Literal["cursor_ahead", "too_far_behind", "expired"]
    fromEventId: EventId
    currentEventId: EventId


def _union(members: list[type[BaseModel]]) -> TypeAdapter[Any]:
    union = cast(Any, Union)[tuple(members)]
    return TypeAdapter(cast(Any, Annotated)[union, Field(discriminator="type")])


def stream_components(ref_template: str) -> dict[str, dict[str, Any]]:
    """The schemas of both streams' frames, by name: `SessionEvent` and `OwnerEvent` (unions on
    `type`), each event and its data, `MessageDelta`, `CaughtUp` and `ResyncRequired`."""
    adapters: list[tuple[str, TypeAdapter[Any]]] = [
        ("SessionEvent", _union(_SESSION_EVENTS)),
        ("OwnerEvent", _union(_OWNER_EVENTS)),
        *(
            (model.__name__, TypeAdapter(model))
            for model in (MessageDelta, CaughtUp, ResyncRequired)
        ),
    ]
    keyed, definitions = TypeAdapter.json_schemas(
        [(name, "serialization", adapter) for name, adapter in adapters],
        ref_template=ref_template,
    )
    schemas: dict[str, dict[str, Any]] = dict(definitions.get("$defs", {}))
    for (name, _), schema in keyed.items():
        schemas.setdefault(name, schema)
    return schemas
