"""The Python SDK: httpx, httpx-sse and pydantic only, no server imports, so it loads fast.

    from app.client import Ferryman

    with Ferryman() as ferryman:  # $FERRYMAN_URL, $FERRYMAN_API_KEY
        session = ferryman.create_session("hello", title="first")
        for event in ferryman.session_events(session.id):
            print(event.type, event.data)

`AsyncFerryman` has the same methods for asyncio; `OwnerSessionClient` keeps a live picture of
an owner's sessions; `SessionFold` folds a session's events into its conversation.
"""

import importlib
from typing import TYPE_CHECKING, Any

from app.client.errors import (
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
from app.client.models import (
    AcceptedMessage,
    ApprovalAccepted,
    CancelAccepted,
    Event,
    Lease,
    MessageAccepted,
    Session,
    SessionPage,
    StreamEvent,
    ToolInfo,
    Transcript,
    Usage,
)
from app.client.sdk import AsyncFerryman, Ferryman

if TYPE_CHECKING:
    from app.client.fold import Conversation, SessionFold
    from app.client.live import OwnerSessionClient

# Loaded when first asked for: a command that only lists sessions does not pay for asyncio.
_LAZY = {
    "Conversation": "app.client.fold",
    "SessionFold": "app.client.fold",
    "OwnerSessionClient": "app.client.live",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AcceptedMessage",
    "ApiError",
    "ApprovalAccepted",
    "AsyncFerryman",
    "AuthenticationError",
    "BadRequestError",
    "CancelAccepted",
    "ConflictError",
    "Conversation",
    "Event",
    "Ferryman",
    "FerrymanConnectionError",
    "FieldError",
    "InternalServerError",
    "Lease",
    "MessageAccepted",
    "NotFoundError",
    "OwnerSessionClient",
    "PayloadTooLargeError",
    "RateLimitError",
    "ServiceUnavailableError",
    "Session",
    "SessionFold",
    "SessionPage",
    "StreamEvent",
    "ToolInfo",
    "Transcript",
    "UnprocessableEntityError",
    "UnsupportedMediaTypeError",
    "Usage",
]
