"""Request and response bodies, camelCase on the wire. Requests forbid unknown fields."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from jsonschema import Draft202012Validator, SchemaError
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from app.domain import (
    MAX_ASSISTANT_DESCRIPTION_CHARS,
    MAX_ASSISTANT_NAME_CHARS,
    MAX_ASSISTANT_VERSIONS,
    MAX_CLIENT_TOOLS,
    MAX_CLIENT_TOOLS_BYTES,
    MAX_DELEGATES,
    MAX_INSTRUCTIONS_CHARS,
    MAX_JSON_DEPTH,
    MAX_KEEP_RECENT_TURNS,
    MAX_MESSAGE_CHARS,
    MAX_METADATA_BYTES,
    MAX_PRIORITY,
    MAX_PROMPT_CHARS,
    MAX_SCRIPT_TURNS,
    MAX_STOP_SEQUENCES,
    MAX_TITLE_CHARS,
    MAX_TOOLS,
    MIN_COMPACTION_TRIGGER_TOKENS,
    MIN_PRIORITY,
    MODEL_NAME_PATTERN,
    OWNER_ID_PATTERN,
    TOOL_NAME_PATTERN,
    Overlap,
    SessionErrorCode,
    Status,
)
from app.errors import ProblemCode
from app.scopes import MAX_SCOPE_ENTRIES, check_scopes


def component(name: str) -> dict[str, str]:
    """A reference to a schema of the OpenAPI document's components."""
    return {"$ref": f"#/components/schemas/{name}"}


# Strings on the wire, typed in the document (the server writes them as strings already).
Uuid = Annotated[str, WithJsonSchema({"type": "string", "format": "uuid"})]
DateTime = Annotated[
    str, WithJsonSchema({"type": "string", "format": "date-time", "description": "RFC 3339, UTC"})
]
EventId = Annotated[
    str, WithJsonSchema({"type": "string", "pattern": "^[0-9]+$", "description": "A decimal id."})
]


def storable(value: Any) -> Any:
    """Reject what PostgreSQL cannot store (NUL characters, unpaired surrogates, NaN and
    Infinity) and JSON nested deeper than the responses can echo back."""
    _check_storable(value, 0)
    return value


def _check_storable(value: Any, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"must not nest more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError("must be valid Unicode (no unpaired surrogates)") from exc
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("numbers must be finite (no NaN or Infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_storable(key, depth + 1)
            _check_storable(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_storable(item, depth + 1)


def _small_json(value: dict[str, Any]) -> dict[str, Any]:
    size = len(json.dumps(value, separators=(",", ":")).encode())
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"must be at most {MAX_METADATA_BYTES} bytes as JSON, got {size}")
    return value


Text = Annotated[str, AfterValidator(storable)]
JsonObject = Annotated[dict[str, Any], AfterValidator(storable), AfterValidator(_small_json)]
ToolName = Annotated[str, Field(min_length=1, max_length=200, pattern=TOOL_NAME_PATTERN)]
Title = Annotated[Text, Field(min_length=1, max_length=MAX_TITLE_CHARS)]


def shown_when_set(description: str) -> Any:
    """A field left out of the answer while it is None (sessions without it read as before)."""
    return Field(default=None, exclude_if=lambda v: v is None, description=description)


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScriptToolCall(Request):
    name: Text = Field(min_length=1, max_length=200)
    arguments: JsonObject = Field(default_factory=dict)


class ScriptFault(Request):
    """The turn fails as a provider would, after its text streamed."""

    kind: Literal[
        "rate_limited",
        "server_error",
        "connection_error",
        "idle_timeout",
        "truncated",
        "bad_request",
        "auth_failed",
        "not_found",
        "context_too_long",
    ]
    times: int = Field(default=1, ge=1, le=100, description="Fails this many plays of the turn.")
    retryAfterMs: int | None = Field(default=None, ge=0, le=600_000)


class ScriptUsage(Request):
    inputTokens: int = Field(ge=0, le=100_000_000)
    outputTokens: int = Field(default=0, ge=0, le=100_000_000)
    cachedTokens: int = Field(default=0, ge=0, le=100_000_000)


class ScriptTurn(Request):
    text: Text | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    toolCalls: list[ScriptToolCall] | None = Field(default=None, max_length=32)
    stopReason: Literal["stop", "tool_use", "length", "error", "aborted"] | None = None
    delayMs: int | None = Field(default=None, ge=0, le=600_000)
    chunks: int | None = Field(default=None, ge=1, le=10_000)
    fault: ScriptFault | None = None
    summary: Text | None = Field(
        default=None,
        max_length=MAX_MESSAGE_CHARS,
        description="The summary a compaction writes when this is the last turn it covers.",
    )
    usage: ScriptUsage | None = Field(
        default=None, description="The usage the turn reports, as a provider would."
    )


StopSequence = Annotated[Text, Field(min_length=1, max_length=200)]


class ToolChoiceMode(StrEnum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"


class ModelSettings(Request):
    """Passed to the provider on every turn; unset ones keep the provider's default."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    topP: float | None = Field(default=None, gt=0, le=1)
    maxTokens: int | None = Field(default=None, ge=1, le=1_000_000)
    toolChoice: ToolChoiceMode | ToolName | None = Field(
        default=None, description='"auto", "none", "required", or the name of a tool to call'
    )
    parallelToolCalls: bool | None = None
    stop: list[StopSequence] | None = Field(default=None, max_length=MAX_STOP_SEQUENCES)
    reasoningEffort: Literal["low", "medium", "high"] | None = None


def tool_choice_problem(
    model_settings: dict[str, Any] | None, tools: list[str] | None
) -> str | None:
    """What is wrong with a definition whose `modelSettings.toolChoice` names a tool that its
    `tools` leaves out (None: nothing)."""
    choice = (model_settings or {}).get("toolChoice")
    named = choice not in (None, *ToolChoiceMode)
    if named and tools is not None and choice not in tools:
        return f"modelSettings.toolChoice names {choice!r}, which is not in tools"
    return None


def _unset(value: Any) -> bool:
    return value is None


class Compaction(Request):
    """When the model's conversation is replaced by a summary (docs/compaction.md)."""

    triggerTokens: int = Field(
        ge=MIN_COMPACTION_TRIGGER_TOKENS,
        le=100_000_000,
        description="Compact before a model call whose request would pass this many tokens.",
    )
    keepRecentTurns: int | None = Field(
        default=None,
        exclude_if=_unset,
        ge=0,
        le=MAX_KEEP_RECENT_TURNS,
        description="Model turns kept verbatim after the summary; unset: 2.",
    )
    model: str | None = Field(
        default=None,
        exclude_if=_unset,
        pattern=MODEL_NAME_PATTERN,
        max_length=220,
        description="The model that writes the summary; unset: the session's own.",
    )
    instructions: Text | None = Field(
        default=None,
        exclude_if=_unset,
        min_length=1,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="The summarizing model's instructions; unset: Ferryman's.",
    )


AssistantId = Annotated[Text, Field(min_length=1, max_length=100)]


class Definition(Request):
    """The agent definition a session runs with, and an assistant stores."""

    model: str | None = Field(
        default=None,
        pattern=MODEL_NAME_PATTERN,
        max_length=220,
        description="`scripted`, `openai:<model>` or `anthropic:<model>`; unset: FERRYMAN_MODEL.",
    )
    tools: list[ToolName] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="The tools the agent may use (GET /api/tools lists them); unset: all. Only"
        " a worker that offers every one of them runs the session.",
    )
    instructions: Text | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="The system prompt.",
    )
    modelSettings: ModelSettings | None = None
    approvalRequired: list[ToolName] | None = Field(
        default=None,
        max_length=MAX_TOOLS,
        description="Tools whose every call waits for a person's approval in this session.",
    )

    compaction: Compaction | None = Field(
        default=None, description="When the conversation is summarized (docs/compaction.md)."
    )
    delegates: list[AssistantId] | None = Field(
        default=None,
        max_length=MAX_DELEGATES,
        description="Assistants (ids, yours) it may hand work to: each is offered to the model"
        " as a tool `agent__<name>` taking `{task}`, whose call runs a child session from that"
        " assistant (docs/delegation.md). 422 for an unknown one or a cycle.",
    )

    def settings_dict(self) -> dict[str, Any] | None:
        """`modelSettings` as stored: the settings given, unset ones left out."""
        return self.modelSettings.model_dump(exclude_none=True) if self.modelSettings else None

    def compaction_dict(self) -> dict[str, Any] | None:
        """`compaction` as stored: the fields given, unset ones left out."""
        return self.compaction.model_dump(exclude_none=True) if self.compaction else None

    @model_validator(mode="after")
    def _tool_choice_is_offered(self) -> Definition:
        problem = tool_choice_problem(self.settings_dict(), self.tools)
        if problem is not None:
            raise ValueError(problem)
        return self


def _json_schema(value: dict[str, Any]) -> dict[str, Any]:
    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as exc:
        raise ValueError(f"must be a JSON Schema: {exc.message}") from None
    return value


JsonSchema = Annotated[dict[str, Any], AfterValidator(storable), AfterValidator(_json_schema)]


class ClientTool(Request):
    """A tool the session's client declares and runs itself (AG-UI's frontend tools): offered
    to the model beside the server's tools; a call of it is not run by a worker, the session
    waits for the client's result (POST .../tool-calls/{toolCallId}/result)."""

    model_config = ConfigDict(extra="ignore")  # as AG-UI clients send them
    name: ToolName
    description: Text = Field(default="", max_length=MAX_CLIENT_TOOLS_BYTES)
    parameters: JsonSchema = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="The arguments' JSON Schema.",
    )


def _client_tools(tools: list[ClientTool] | None) -> list[ClientTool] | None:
    if not tools:
        return tools
    names = [t.name for t in tools]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"names a tool more than once: {', '.join(twice)}")
    size = len(json.dumps([t.model_dump() for t in tools], separators=(",", ":")).encode())
    if size > MAX_CLIENT_TOOLS_BYTES:
        raise ValueError(f"must be at most {MAX_CLIENT_TOOLS_BYTES} bytes as JSON, got {size}")
    return tools


ClientTools = Annotated[
    list[ClientTool] | None,
    Field(
        default=None,
        max_length=MAX_CLIENT_TOOLS,
        description="Tools the client runs itself: the model may call them, and the session"
        " waits for the client's result of each call (docs/ag-ui.md). Their names must not be"
        " those of the session's server tools.",
    ),
    AfterValidator(_client_tools),
]


class CreateSession(Definition):
    prompt: Text | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_PROMPT_CHARS,
        description="The opening message (seq 1). Unset: the session is created `idle`, with"
        " no run until its first message, which becomes its prompt.",
    )
    title: Title | None = None
    script: list[ScriptTurn] | None = Field(default=None, max_length=MAX_SCRIPT_TURNS)
    metadata: JsonObject | None = Field(
        default=None,
        description=f"Yours to keep with the session: at most {MAX_METADATA_BYTES} bytes.",
    )
    assistantId: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="Run this assistant's definition (model, instructions, modelSettings, tools,"
        " approvalRequired, compaction); the fields given here override its own"
        " (modelSettings key by key). 404 ASSISTANT_NOT_FOUND for none of yours.",
    )
    assistantVersion: int | None = Field(
        default=None,
        ge=1,
        le=MAX_ASSISTANT_VERSIONS,
        description="The version of `assistantId` to pin; unset: its latest.",
    )
    clientTools: ClientTools
    priority: int | None = Field(
        default=None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="Workers claim sessions of a higher priority first; within a priority,"
        " claims are fair across owners (docs/fairness.md). Unset: the key's policy's"
        " `priority`, else 0.",
    )

    @model_validator(mode="after")
    def _version_of_an_assistant(self) -> CreateSession:
        if self.assistantVersion is not None and self.assistantId is None:
            raise ValueError("assistantVersion needs assistantId")
        return self


AssistantName = Annotated[Text, Field(min_length=1, max_length=MAX_ASSISTANT_NAME_CHARS)]
AssistantDescription = Annotated[Text, Field(max_length=MAX_ASSISTANT_DESCRIPTION_CHARS)]


class CreateAssistant(Definition):
    name: AssistantName
    script: list[ScriptTurn] | None = Field(
        default=None,
        max_length=MAX_SCRIPT_TURNS,
        description="The scripted model's turns for its sessions that give none (its"
        " delegates' children among them).",
    )
    description: AssistantDescription | None = None
    model: str = Field(  # required here, optional on a session
        pattern=MODEL_NAME_PATTERN,
        max_length=220,
        description="`scripted`, `openai:<model>` or `anthropic:<model>`.",
    )
    metadata: JsonObject | None = Field(
        default=None,
        description=f"Yours to keep with the assistant: at most {MAX_METADATA_BYTES} bytes.",
    )


class Changes(Request):
    """A PATCH body: the fields given change, and it must give one."""

    @model_validator(mode="after")
    def _changes_something(self) -> Self:
        if not self.model_fields_set:
            raise ValueError("give at least one field to change")
        return self


class UpdateAssistant(Definition, Changes):
    """The fields to change: each PATCH writes a new version. A field set to null is cleared
    (`tools: null`: all tools); `name` and `model` cannot be."""

    name: AssistantName | None = None
    description: AssistantDescription | None = None
    metadata: JsonObject | None = None
    script: list[ScriptTurn] | None = Field(default=None, max_length=MAX_SCRIPT_TURNS)

    @field_validator("name", "model", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError("cannot be null: every version has one")
        return value


class AssistantRef(BaseModel):
    id: Uuid
    version: int


class Assistant(BaseModel):
    id: Uuid
    name: str
    description: str | None
    model: str
    instructions: str | None
    modelSettings: dict[str, Any]
    tools: list[str] | None = Field(description="null: all tools.")
    approvalRequired: list[str]
    metadata: dict[str, Any]
    compaction: Compaction | None = Field(
        default=None, description="Taken by its sessions unless they give their own."
    )
    delegates: list[Uuid] | None = shown_when_set("Absent: none.")
    script: list[dict[str, Any]] | None = shown_when_set(
        "The scripted model's turns as given (ScriptTurn); absent: none."
    )
    version: int = Field(description="1 at create; each PATCH writes the next.")
    createdAt: DateTime
    updatedAt: DateTime = Field(description="When this version was written.")


class AssistantList(BaseModel):
    assistants: list[Assistant]
    nextPageToken: str | None


class AssistantVersions(BaseModel):
    versions: list[Assistant] = Field(description="The assistant as each version has it.")
    nextPageToken: str | None


class RenameSession(Request):
    title: Title


class PostMessage(Request):
    text: Text = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


class ForkSession(Request):
    atSeq: int = Field(
        ge=1,
        le=2**63 - 1,
        description="The last event of the parent's log the fork keeps (a committed seq).",
    )
    message: Text | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        description="Replaces the user message at `atSeq` (edit and regenerate).",
    )
    title: Title | None = Field(
        default=None, description="The fork's title (default: the parent's)."
    )


class Approve(Request):
    approved: bool
    reason: Text | None = Field(default=None, min_length=1, max_length=MAX_MESSAGE_CHARS)


class PostToolResult(Request):
    content: Text = Field(max_length=MAX_MESSAGE_CHARS, description="What the tool returned.")
    isError: bool = Field(default=False, description="Whether the tool failed.")


class ToolResultAccepted(BaseModel):
    id: Uuid
    toolCallId: str
    seq: int = Field(description="The seq of the `client_tool_result` event.")
    duplicate: bool = Field(description="The same result was posted before: nothing written.")
    status: Status


class CompactionAccepted(BaseModel):
    id: Uuid
    seq: int = Field(description="The seq of the `compaction_requested` event.")
    status: Status = Field(description="`queued` for a session that was waiting or finished.")


class ApprovalAccepted(BaseModel):
    id: Uuid
    toolCallId: str
    approved: bool
    seq: int
    status: Status


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    checks: dict[str, str] = Field(description="database, migrations, listen: each `ok`.")


class Usage(BaseModel):
    inputTokens: int
    outputTokens: int
    cachedTokens: int


class ToolInfo(BaseModel):
    name: str
    description: str
    parameters: dict[str, Any]
    idempotent: bool
    requiresApproval: bool
    source: str = Field(description='"builtin", "plugin" or "mcp:<server>"')
    workers: int = Field(
        description="How many live workers offer it: fewer than the top-level `workers` when"
        " only some do (a session naming it runs on one of those)."
    )


class ToolList(BaseModel):
    tools: list[ToolInfo]
    workers: int = Field(description="How many workers are alive now.")


class FieldError(BaseModel):
    field: str = Field(description="The field at fault: `title`, `modelSettings.stop.1`, `body`.")
    message: str = Field(description="The rule it broke, in plain words.")
    type: str = Field(description="The kind of error, stable: `missing`, `string_too_long`, ...")


def _optional_without_null(schema: dict[str, Any]) -> None:
    """For schemas only documented: a field that may be absent is just not required (no null,
    no default), so generated clients type it `T | undefined`, not `T | null`."""
    for field in schema.get("properties", {}).values():
        field.pop("default", None)


class Problem(BaseModel):
    """An error (RFC 9457 problem+json). Switch on `code`."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_optional_without_null)

    type: str = Field(description='Always "about:blank": `code` says what happened.')
    title: str
    status: int
    code: ProblemCode
    detail: str = Field(description="What is wrong and what to do, for people.")
    errors: list[FieldError] = Field(
        default_factory=list, description="With VALIDATION_ERROR: every field at fault."
    )
    sessionStatus: Status = Field(
        default=Status.SUCCEEDED, description="With SESSION_ALREADY_TERMINAL: the status."
    )
    limit: int = Field(
        default=0,
        description="With TOO_MANY_STREAMS: the streams allowed; with FORK_TOO_LONG, the"
        " events a fork may copy.",
    )
    lastSeq: int = Field(
        default=0, description="With FORK_SEQ_OUT_OF_RANGE: the parent's last committed seq."
    )
    eventType: str = Field(
        default="", description="With FORK_NOT_USER_MESSAGE: the type of the event at `atSeq`."
    )
    cycle: list[str] = Field(
        default_factory=list,
        description="With DELEGATE_CYCLE: the chain of assistant ids, the repeated one last.",
    )


class SessionError(BaseModel):
    """Why a session failed."""

    model_config = ConfigDict(extra="allow")

    code: str = Field(description=f"One of {', '.join(SessionErrorCode)} (docs/reference.md).")
    message: str


class Lease(BaseModel):
    workerId: str
    pid: int | None
    expiresAt: DateTime | None


class ForkedFrom(BaseModel):
    sessionId: Uuid = Field(description="The session it was forked from.")
    seq: int = Field(description="The parent's seq the fork was made at (its `atSeq`).")


class Parent(BaseModel):
    sessionId: Uuid = Field(description="The session whose delegate call made this one.")
    toolCallId: str = Field(description="That call's id: one child per call.")


class Session(BaseModel):
    id: Uuid
    ownerId: str
    title: str
    status: Status
    attempt: int = Field(description="How many runs the session has had: every claim adds 1.")
    resumes: int = Field(
        description="How many of those runs took the session over from one that did not finish"
        " (its worker crashed or lost its lease, or shut down): not follow-ups or approvals."
    )
    model: str
    prompt: str = Field(description="The opening message; empty while the session is `idle`.")
    activeStage: str | None
    error: Annotated[
        dict[str, Any] | None,
        WithJsonSchema({"anyOf": [component("SessionError"), {"type": "null"}]}),
    ]
    cancelRequested: bool
    lease: Lease | None
    lastSeq: int
    createdAt: DateTime
    updatedAt: DateTime
    metadata: dict[str, Any]
    instructions: str | None
    modelSettings: dict[str, Any]
    approvalRequired: list[str]
    assistant: AssistantRef | None = Field(
        description="The assistant version the definition was copied from (kept for every"
        " turn and resume), or null."
    )
    usage: Usage
    clientTools: list[ClientTool] | None = shown_when_set(
        "The tools its client declared (absent: none)."
    )
    compaction: Compaction | None = shown_when_set(
        "When and how its conversation is compacted (absent: never)."
    )
    forkedFrom: ForkedFrom | None = shown_when_set(
        "Where a fork's history came from (absent: not a fork)."
    )
    delegates: list[Uuid] | None = shown_when_set(
        "The assistants it may delegate to (absent: none)."
    )
    parent: Parent | None = shown_when_set(
        "The delegate call that made it (absent: not a delegate's child)."
    )
    schedule: ScheduleRef | None = shown_when_set(
        "The schedule that fired it and the tick it fired for (absent: none)."
    )
    priority: int | None = shown_when_set(
        "Its claim priority: higher first (absent: 0, the default)."
    )
    waitingFor: WaitingFor | None = shown_when_set(
        "Why a queued session is not claimed yet, when a limit holds it (absent: none does)."
    )


class WaitingFor(BaseModel):
    reason: Literal["ownerRunningLimit"] = Field(
        description="`ownerRunningLimit`: its owner has FERRYMAN_OWNER_MAX_RUNNING sessions"
        " running (docs/tenants.md)."
    )
    running: int
    limit: int


class ScheduleRef(BaseModel):
    id: Uuid
    firedAt: DateTime = Field(description="The tick it fired for (the cron's time, in UTC).")


class SessionSummary(Session):
    """A session as a list shows it (docs/tenants.md "What a tenant sees")."""

    prompt: str = Field(
        description="The opening message's first FERRYMAN_LIST_EXCERPT_CHARS characters (200);"
        " empty while the session is `idle`."
    )
    instructions: str | None = Field(
        description="Its first FERRYMAN_LIST_EXCERPT_CHARS characters, or null."
    )
    truncated: list[Literal["prompt", "instructions"]] = Field(
        description="The fields cut here: GET the session for them whole."
    )


class SessionList(BaseModel):
    sessions: list[SessionSummary] = Field(
        description="At most `limit`, and no more than FERRYMAN_LIST_MAX_BYTES of answer holds"
        " (at least one): a shorter page has a `nextPageToken` too."
    )
    cursor: str = Field(description="Owner-event cursor of this snapshot: stream from it.")
    nextPageToken: str | None


class CancelAccepted(BaseModel):
    id: Uuid
    cancelRequested: Literal[True]
    status: Status


class MessageOut(BaseModel):
    seq: int
    text: str
    delivery: Literal["steer", "queued"]


class MessageAccepted(BaseModel):
    id: Uuid
    message: MessageOut


class Transcript(BaseModel):
    events: list[Annotated[dict[str, Any], WithJsonSchema(component("SessionEvent"))]] = Field(
        description="In the session stream's envelope, with `phase: backlog`."
    )
    lastSeq: int
    nextAfter: int | None = Field(
        description="Pass as `after` for the next page; null when this page reaches `lastSeq`."
    )


# The fields of a schedule's own; the rest of its body is the session each firing creates.
SCHEDULE_FIELDS = frozenset({"cron", "timezone", "enabled", "overlap", "prompt", "title"})
Cron = Annotated[
    Text,
    Field(
        description="Five fields (minute hour day-of-month month day-of-week), or six with"
        " seconds first, or `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`. Bad: 422"
        " SCHEDULE_CRON_INVALID.",
        examples=["30 2 * * *"],
    ),
]
Timezone = Annotated[
    Text,
    Field(
        description="An IANA time zone the cron reads its times in. Bad: 422"
        " SCHEDULE_TIMEZONE_INVALID.",
        examples=["Europe/Berlin"],
    ),
]
OverlapField = Annotated[
    Overlap,
    Field(
        description="While the session it fired last has not ended: `skip` the tick, `queue`"
        " one firing until it ends, or `allow` it to run beside it (docs/schedules.md)."
    ),
]


class CreateSchedule(CreateSession):
    """A timetable and the session each of its ticks creates: the session fields are those of
    a create (`assistantId` or a definition of its own), checked the same way."""

    cron: Cron
    timezone: Timezone = "UTC"
    enabled: bool = True
    overlap: OverlapField = Overlap.SKIP
    prompt: Text = Field(  # required here: a fired session starts at once
        min_length=1, max_length=MAX_PROMPT_CHARS, description="The opening message of each."
    )
    sessionId: Uuid | None = Field(
        default=None,
        description="Bind the schedule to this session of yours: each tick posts `prompt` to"
        " it as a follow-up message (overlap applies to its runs) instead of creating a"
        " session; no session field may be given with it. 404 SESSION_NOT_FOUND for none of"
        " yours. The schedule is deleted with the session.",
    )

    @model_validator(mode="after")
    def _bound_without_definition(self) -> CreateSchedule:
        if self.sessionId is not None:
            given = self.model_fields_set - SCHEDULE_FIELDS - {"sessionId"}
            if given:
                raise ValueError(
                    f"{', '.join(sorted(given))}: a schedule bound to a session (sessionId)"
                    " runs with that session's definition"
                )
        return self


def _refuse_null(value: Any) -> Any:
    if value is None:
        raise ValueError("cannot be null")
    return value


# A PATCH field that may be left out but not cleared.
NotNull = BeforeValidator(_refuse_null)


class UpdateSchedule(CreateSession, Changes):
    """The fields to change. A session field set to null is cleared (`tools: null`: all tools),
    as `title` is; `cron`, `timezone`, `enabled`, `overlap` and `prompt` cannot be. A new cron
    or time zone, or `enabled: true`, starts from the next tick after now."""

    cron: Annotated[Cron | None, NotNull] = None
    timezone: Annotated[Timezone | None, NotNull] = None
    enabled: Annotated[bool | None, NotNull] = None
    overlap: Annotated[OverlapField | None, NotNull] = None
    prompt: Annotated[Text | None, NotNull, Field(min_length=1, max_length=MAX_PROMPT_CHARS)] = None


class ScheduleFiring(BaseModel):
    tick: DateTime = Field(description="The cron time it was for.")
    at: DateTime = Field(description="When it was decided.")
    outcome: Literal["fired", "skipped", "queued", "missed", "failed"] = Field(
        description="`fired` a session; `skipped` (overlap: the last session had not ended);"
        " `queued` (waits for it to end, then fires); `missed` (reached too late, with"
        " FERRYMAN_SCHEDULE_CATCH_UP=false); `failed` (the error is in `detail`)."
    )
    catchUp: bool = Field(description="It stood for ticks missed while no worker ran.")
    sessionId: Uuid | None
    sessionStatus: Status | None = Field(description="That session's status now.")
    detail: str | None


class Schedule(BaseModel):
    id: Uuid
    ownerId: str
    cron: str
    timezone: str
    enabled: bool
    overlap: Overlap
    title: str | None = Field(description="Each fired session's title; null: from the prompt.")
    prompt: str
    model: str
    instructions: str | None
    modelSettings: dict[str, Any]
    tools: list[str] | None = Field(description="null: all tools.")
    approvalRequired: list[str]
    metadata: dict[str, Any]
    assistant: AssistantRef | None = Field(
        description="The assistant version the definition was copied from (at create, or at"
        " the last PATCH of a session field), or null."
    )
    sessionId: Uuid | None = Field(
        description="The session each tick posts its prompt to; null: each creates one."
    )
    endTime: DateTime | None = Field(
        description="No tick after it fires (an Agent Protocol cron's `end_time`); null: none."
    )
    nextRunAt: DateTime | None = Field(description="The next tick; null while paused.")
    pendingTick: DateTime | None = Field(
        description="overlap `queue`: the tick of the firing waiting for the last session."
    )
    lastFirings: list[ScheduleFiring] = Field(description="Newest first.")
    createdAt: DateTime
    updatedAt: DateTime


class ScheduleList(BaseModel):
    schedules: list[Schedule]
    nextPageToken: str | None


class PendingApproval(BaseModel):
    sessionId: Uuid
    ownerId: str
    title: str
    toolCallId: str
    name: str = Field(description="The tool the call would run.")
    arguments: dict[str, Any]
    seq: int = Field(description="The seq of its `tool_approval_requested` event.")
    requestedAt: DateTime


class PendingApprovalList(BaseModel):
    approvals: list[PendingApproval] = Field(description="Oldest request first.")


# --- keys (docs/tenants.md) ------------------------------------------------------------------


class KeyPolicy(Request):
    """What a key may do beyond its owner's defaults (`api_keys.policy`); a field left out
    takes the setting's default."""

    priority: int | None = Field(
        default=None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        description="The `priority` of the sessions this key creates without one.",
    )
    createsPerMinute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Creates a minute (overrides FERRYMAN_KEY_CREATES_PER_MINUTE).",
    )
    messagesPerMinute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Messages a minute (overrides FERRYMAN_KEY_MESSAGES_PER_MINUTE).",
    )

    tools: list[str] | None = Field(
        default=None,
        max_length=MAX_SCOPE_ENTRIES,
        description="Only these tools: names, or `mcp:<server>` for all of that MCP server's"
        " (docs/tenants.md). Unset: every tool; `[]`: none.",
    )
    models: list[str] | None = Field(
        default=None,
        max_length=MAX_SCOPE_ENTRIES,
        description="Only these models: names (`openai:gpt-4o`), or provider prefixes"
        " (`openai:`). Unset: every model.",
    )
    approverFor: list[str] | None = Field(
        default=None,
        max_length=MAX_SCOPE_ENTRIES,
        description="Owners whose pending approvals this key may list and decide.",
    )

    @model_validator(mode="after")
    def _scopes(self) -> Self:
        check_scopes(self.model_dump(include={"tools", "models", "approverFor"}, exclude_none=True))
        return self

    def stored(self) -> dict[str, Any]:
        """The policy as `api_keys.policy` keeps it: the fields set."""
        return self.model_dump(mode="json", exclude_none=True)


class CreateKey(Request):
    owner: str = Field(pattern=OWNER_ID_PATTERN.pattern, description="The owner it acts as.")
    name: Text = Field(default="", max_length=MAX_TITLE_CHARS, description="A label.")
    policy: KeyPolicy = Field(default_factory=KeyPolicy)


class UpdateKey(Request):
    name: Title | None = None
    policy: KeyPolicy | None = Field(
        default=None,
        description="Merged into the key's policy: the fields given replace its own, a field"
        " given as null goes back to the default.",
    )


class ApiKey(BaseModel):
    id: Uuid
    ownerId: str
    name: str
    prefix: str = Field(description="The key's first characters, to tell keys apart.")
    policy: Annotated[dict[str, Any], WithJsonSchema({"allOf": [component("KeyPolicy")]})]
    createdAt: DateTime
    lastUsedAt: DateTime | None
    revokedAt: DateTime | None


class CreatedKey(ApiKey):
    key: str = Field(description="The key itself: shown this once, stored only hashed.")


class KeyList(BaseModel):
    keys: list[ApiKey]
