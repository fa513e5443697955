"""What the API answers, as pydantic models: snake_case attributes, camelCase on the wire.

Unknown fields are kept (`extra="allow"`), so a newer server does not break an older client;
`model_dump(by_alias=True)` gives the wire form back."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

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


class Session(Model):
    id: str
    owner_id: str
    title: str
    status: str
    attempt: int
    model: str
    prompt: str
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
    usage: Usage = Field(default_factory=Usage)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class SessionPage(Model):
    sessions: list[Session]
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


class ToolInfo(Model):
    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    idempotent: bool = False
    requires_approval: bool = False
    source: str = ""


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


@dataclass(frozen=True)
class StreamEvent:
    """One frame of a stream. Durable events have an `id` (the session's seq, or the owner
    cursor); control (`caught_up`, `resync_required`) and ephemeral (`message_delta`) frames
    have none and never move a cursor."""

    type: str
    id: str | None
    data: dict[str, Any]
    envelope: dict[str, Any] = field(repr=False)

    @classmethod
    def of(cls, type_: str, id_: str | None, envelope: dict[str, Any]) -> StreamEvent:
        # Control frames are their payload; events wrap theirs in the envelope's `data`.
        data = envelope.get("data") if "type" in envelope else envelope
        return cls(type_, id_, data if isinstance(data, dict) else {}, envelope)

    @property
    def durable(self) -> bool:
        return self.id is not None

    @property
    def seq(self) -> int | None:
        seq = self.envelope.get("seq")
        return seq if isinstance(seq, int) else None

    @property
    def session_id(self) -> str | None:
        session_id = self.envelope.get("sessionId")
        return str(session_id) if session_id is not None else None

    def event(self) -> Event:
        """The envelope as an `Event` (durable and ephemeral frames; not control ones)."""
        return Event.model_validate({"id": self.id or "", **self.envelope})
