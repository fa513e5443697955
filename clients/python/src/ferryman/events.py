"""`StreamEvent`: one frame of an SSE stream, as the API sent it. A plain dataclass, without
pydantic, so that streaming (and the CLI) does not import it; `StreamEvent.event()` gives the
`Event` model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ferryman.models import Event


@dataclass(frozen=True)
class StreamEvent:
    """One frame of a stream. Durable events have an `id` (the session's seq, or the owner
    cursor); a token delta (`message_delta`) has `<seq>.<chunk>`, a place to resume from (the
    chunks of the turn after this one) rather than an event; control frames (`caught_up`,
    `resync_required`) have none and never move a cursor."""

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
        return self.id is not None and self.chunk is None

    @property
    def chunk(self) -> int | None:
        """A token delta's number among those that follow its `afterSeq` (1, 2, 3...)."""
        chunk = self.envelope.get("chunk")
        return chunk if isinstance(chunk, int) and self.type == "message_delta" else None

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
        from ferryman.models import Event

        return Event.model_validate({"id": self.id or "", **self.envelope})
