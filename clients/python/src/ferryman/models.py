"""What the API answers, as pydantic models: snake_case attributes, camelCase on the wire.

Unknown fields are kept (`extra="allow"`), so a newer server does not break an older client;
`model_dump(by_alias=True)` gives the wire form back. `StreamEvent` (ferryman/events.py, no
pydantic) is re-exported here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ferryman.events import StreamEvent

__all__ = [
    "AcceptedMessage",
    "ApprovalAccepted",
    "Assistant",
    "AssistantPage",
    "AssistantRef",
    "AssistantVersions",
    "CancelAccepted",
    "Event",
    "ForkedFrom",
    "Lease",
    "MessageAccepted",
    "Model",
    "Parent",
    "Schedule",
    "ScheduleFiring",
    "SchedulePage",
    "ScheduleRef",
    "Session",
    "SessionPage",
    "StreamEvent",
    "ToolCatalog",
    "ToolInfo",
    "Transcript",
    "Usage",
    "Webhook",
    "WebhookDelivery",
    "WebhookDeliveryPage",
    "WebhookList",
]

TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class Model(BaseModel):
    # defer_build: a schema is built on first use, not at import (CLI start-up time).
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="allow", defer_build=True
    )


class Lease(Model):
    worker_id: str
    pid: int | None = None
    expires_at: datetime | None = None


class Usage(Model):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


class AssistantRef(Model):
    id: str
    version: int


class ForkedFrom(Model):
    """Where a fork's history came from: the session and the seq it was forked at."""

    session_id: str
    seq: int


class Parent(Model):
    """The delegate call that made a child session: the parent session and its call's id."""

    session_id: str
    tool_call_id: str


class Assistant(Model):
    """A stored agent definition at one of its versions."""

    id: str
    name: str
    description: str | None = None
    model: str
    instructions: str | None = None
    model_settings: dict[str, Any] = Field(default_factory=dict)
    tools: list[str] | None = None  # None: all tools
    approval_required: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # The assistants its sessions may delegate to (None: none).
    delegates: list[str] | None = None
    version: int
    created_at: datetime
    updated_at: datetime  # when this version was written


class AssistantPage(Model):
    assistants: list[Assistant]
    next_page_token: str | None = None


class AssistantVersions(Model):
    versions: list[Assistant]  # newest first
    next_page_token: str | None = None


class WaitingFor(Model):
    # Why a queued session is not claimed yet: "ownerRunningLimit" (docs/tenants.md).
    reason: str
    running: int
    limit: int


class ScheduleRef(Model):
    id: str
    fired_at: datetime  # the tick it fired for


class ScheduleFiring(Model):
    tick: datetime
    at: datetime
    outcome: str  # fired, skipped, queued, missed or failed
    catch_up: bool = False
    session_id: str | None = None
    session_status: str | None = None
    detail: str | None = None


class Schedule(Model):
    """A cron timetable and the session each of its ticks creates."""

    id: str
    owner_id: str
    cron: str
    timezone: str
    enabled: bool
    overlap: str  # skip, queue or allow
    title: str | None = None
    prompt: str
    model: str
    instructions: str | None = None
    model_settings: dict[str, Any] = Field(default_factory=dict)
    tools: list[str] | None = None  # None: all tools
    approval_required: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    assistant: AssistantRef | None = None
    session_id: str | None = None  # the session each tick posts to; None: each creates one
    end_time: datetime | None = None  # no tick after it
    next_run_at: datetime | None = None  # None while paused
    pending_tick: datetime | None = None
    last_firings: list[ScheduleFiring] = Field(default_factory=list)  # newest first
    created_at: datetime
    updated_at: datetime


class SchedulePage(Model):
    schedules: list[Schedule]
    next_page_token: str | None = None


class RunWebhookSecret(Model):
    """The secret an owner's Agent Protocol run webhooks are signed with from now on."""

    secret: str
    created_at: datetime


class Webhook(Model):
    """A subscription to events of the owner's sessions (docs/webhooks.md)."""

    id: str
    url: str
    events: list[str]
    created_at: datetime
    updated_at: datetime
    secret: str | None = None  # the signing secret: only in the answer to a create


class WebhookList(Model):
    webhooks: list[Webhook]


class WebhookDelivery(Model):
    id: str  # also the `webhook-id` header of each attempt
    session_id: str
    type: str
    created_at: datetime
    status: str  # pending, delivered, abandoned
    attempts: int
    last_status_code: int | None = None
    last_error: str | None = None
    last_attempt_at: datetime | None = None
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None


class WebhookDeliveryPage(Model):
    deliveries: list[WebhookDelivery]  # newest first
    next_page_token: str | None = None


class Session(Model):
    id: str
    owner_id: str
    title: str
    status: str
    # Runs so far: every claim counts, a follow-up's or an approval's too.
    attempt: int
    # Takeovers: runs that another worker started after a crash or a shutdown.
    resumes: int = 0
    model: str
    prompt: str  # empty while the session is idle (created without one)
    active_stage: str | None = None
    error: dict[str, Any] | None = None
    cancel_requested: bool = False
    lease: Lease | None = None
    last_seq: int
    created_at: datetime
    updated_at: datetime
    metadata: dict[str, Any] = Field(default_factory=dict)
    instructions: str | None = None
    model_settings: dict[str, Any] = Field(default_factory=dict)
    approval_required: list[str] = Field(default_factory=list)
    # The assistant version the definition was copied from (None: none, or an older server).
    assistant: AssistantRef | None = None
    usage: Usage = Field(default_factory=Usage)
    # A fork's origin (None: not a fork).
    forked_from: ForkedFrom | None = None
    # The schedule that fired it (None: none, or an older server).
    schedule: ScheduleRef | None = None
    # The assistants it may delegate to (None: none); a child's delegate call (None: none).
    delegates: list[str] | None = None
    parent: Parent | None = None
    # Its claim priority, higher first (0: the default, or an older server).
    priority: int = 0
    # Why it waits while queued, when a limit holds it (None: none does).
    waiting_for: WaitingFor | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class SessionSummary(Session):
    """A session as a list shows it: `prompt` and `instructions` are their first 200
    characters (the server's FERRYMAN_LIST_EXCERPT_CHARS); `truncated` names those cut (get the
    session for them whole)."""

    truncated: list[str] = Field(default_factory=list)


class SessionPage(Model):
    # Summaries, at most `limit` and no more than the server's FERRYMAN_LIST_MAX_BYTES holds.
    sessions: list[SessionSummary]
    # The owner-event cursor of this page's snapshot: stream owner events from it.
    cursor: str
    next_page_token: str | None = None


class CancelAccepted(Model):
    id: str
    cancel_requested: bool
    status: str


class AcceptedMessage(Model):
    seq: int
    text: str
    delivery: str  # "steer" (a running session) or "queued"


class MessageAccepted(Model):
    id: str
    message: AcceptedMessage


class ApprovalAccepted(Model):
    id: str
    tool_call_id: str
    approved: bool
    seq: int
    status: str


class CompactionAccepted(Model):
    """POST /compact: the `compaction_requested` event's seq, and the session's status."""

    id: str
    seq: int
    status: str


class ToolInfo(Model):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    idempotent: bool = False
    requires_approval: bool = False
    source: str = ""
    # How many live workers offer it (None from a server that does not count them).
    workers: int | None = None


class ToolCatalog(Model):
    """`GET /api/tools`: the tools of the workers alive now."""

    tools: list[ToolInfo]
    # How many workers are alive (None from a server that does not count them).
    workers: int | None = None


class Event(Model):
    """An event's envelope. Session events carry `seq` and `attempt`; owner events do not."""

    id: str
    type: str
    session_id: str
    owner_id: str
    ts: datetime
    phase: str | None = None
    seq: int | None = None
    attempt: int | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class Transcript(Model):
    events: list[Event]
    last_seq: int
    # Pass as `after` for the next page; None once this page reaches `last_seq`.
    next_after: int | None = None
