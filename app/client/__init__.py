"""The Python SDK: httpx, httpx-sse and pydantic only, no server imports, so it loads fast
(pydantic and the models only once first used: `Ferryman.raw` answers the API's JSON).

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
from app.client.events import StreamEvent
from app.client.sdk import AsyncFerryman, Ferryman, RawFerryman

if TYPE_CHECKING:
    from app.client.fold import Conversation, SessionFold
    from app.client.live import OwnerSessionClient
    from app.client.models import (
        AcceptedMessage,
        ApprovalAccepted,
        CancelAccepted,
        Event,
        Lease,
        MessageAccepted,
        Session,
        SessionPage,
        ToolInfo,
        Transcript,
        Usage,
    )

# Loaded when first asked for: the CLI's commands need neither asyncio nor pydantic (the models)
# unless they use them (`Ferryman.raw` answers dicts).
_MODELS = (
    "AcceptedMessage",
    "ApprovalAccepted",
    "CancelAccepted",
    "Event",
    "Lease",
    "MessageAccepted",
    "Session",
    "SessionPage",
    "ToolInfo",
    "Transcript",
    "Usage",
)
_LAZY = {
    **dict.fromkeys(_MODELS, "app.client.models"),
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
    "RawFerryman",
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
