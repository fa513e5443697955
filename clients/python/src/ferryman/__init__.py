"""Ferryman's Python SDK: httpx, httpx-sse and pydantic only, no server code.

    from ferryman import Ferryman

    with Ferryman() as ferryman:  # $FERRYMAN_URL, $FERRYMAN_API_KEY
        session = ferryman.create_session("hello", title="first")
        for event in ferryman.session_events(session.id):
            print(event.type, event.data)

`AsyncFerryman` has the same methods for asyncio; `OwnerSessionClient` keeps a live picture of
an owner's sessions; `SessionFold` folds a session's events into its conversation.

Every name is imported when first asked for: `ferryman --help` (the `ferryman.cli` package
lives here) loads no httpx, and the CLI's commands no pydantic (`Ferryman.raw` answers the
API's JSON; the models load with the first answer parsed into one).
"""

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ferryman._core import UNSET
    from ferryman.errors import (
        ApiError,
        AuthenticationError,
        BadRequestError,
        ConflictError,
        FerrymanConnectionError,
        FieldError,
        InternalServerError,
        NotFoundError,
        PayloadTooLargeError,
        RateLimitError,
        ServiceUnavailableError,
        UnprocessableEntityError,
        UnsupportedMediaTypeError,
    )
    from ferryman.events import StreamEvent
    from ferryman.fold import Conversation, SessionFold
    from ferryman.live import OwnerSessionClient
    from ferryman.models import (
        AcceptedMessage,
        ApprovalAccepted,
        Assistant,
        AssistantPage,
        AssistantRef,
        AssistantVersions,
        CancelAccepted,
        CompactionAccepted,
        Event,
        ForkedFrom,
        Lease,
        MessageAccepted,
        Parent,
        Schedule,
        ScheduleFiring,
        SchedulePage,
        ScheduleRef,
        Session,
        SessionPage,
        SessionSummary,
        ToolCatalog,
        ToolInfo,
        Transcript,
        Usage,
        WaitingFor,
    )
    from ferryman.sdk import AsyncFerryman, Ferryman, RawFerryman

_ERRORS = (
    "ApiError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "FerrymanConnectionError",
    "FieldError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServiceUnavailableError",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
)
_MODELS = (
    "AcceptedMessage",
    "ApprovalAccepted",
    "Assistant",
    "AssistantPage",
    "AssistantRef",
    "AssistantVersions",
    "CancelAccepted",
    "CompactionAccepted",
    "Event",
    "ForkedFrom",
    "Lease",
    "MessageAccepted",
    "Parent",
    "Schedule",
    "ScheduleFiring",
    "SchedulePage",
    "ScheduleRef",
    "Session",
    "SessionPage",
    "SessionSummary",
    "ToolCatalog",
    "ToolInfo",
    "Transcript",
    "Usage",
    "WaitingFor",
)
_LAZY = {
    **dict.fromkeys(_ERRORS, "ferryman.errors"),
    **dict.fromkeys(_MODELS, "ferryman.models"),
    **dict.fromkeys(("AsyncFerryman", "Ferryman", "RawFerryman"), "ferryman.sdk"),
    "StreamEvent": "ferryman.events",
    "Conversation": "ferryman.fold",
    "SessionFold": "ferryman.fold",
    "OwnerSessionClient": "ferryman.live",
    "UNSET": "ferryman._core",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "UNSET",
    "AcceptedMessage",
    "ApiError",
    "ApprovalAccepted",
    "Assistant",
    "AssistantPage",
    "AssistantRef",
    "AssistantVersions",
    "AsyncFerryman",
    "AuthenticationError",
    "BadRequestError",
    "CancelAccepted",
    "CompactionAccepted",
    "ConflictError",
    "Conversation",
    "Event",
    "Ferryman",
    "FerrymanConnectionError",
    "FieldError",
    "ForkedFrom",
    "InternalServerError",
    "Lease",
    "MessageAccepted",
    "NotFoundError",
    "OwnerSessionClient",
    "Parent",
    "PayloadTooLargeError",
    "RateLimitError",
    "RawFerryman",
    "Schedule",
    "ScheduleFiring",
    "SchedulePage",
    "ScheduleRef",
    "ServiceUnavailableError",
    "Session",
    "SessionFold",
    "SessionPage",
    "SessionSummary",
    "StreamEvent",
    "ToolCatalog",
    "ToolInfo",
    "Transcript",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
    "Usage",
    "WaitingFor",
]
