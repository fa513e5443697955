"""The Python SDK: httpx, httpx-sse and pydantic only, no server imports, so it loads fast.

    from app.client import Ferryman

    with Ferryman() as ferryman:  # $FERRYMAN_URL, $FERRYMAN_API_KEY
        session = ferryman.create_session("hello", title="first")
        for event in ferryman.session_events(session.id):
            print(event.type, event.data)

`AsyncFerryman` has the same methods for asyncio; `OwnerSessionClient` keeps a live picture of
an owner's sessions; `SessionFold` folds a session's events into its conversation.
"""

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
    StreamEvent,
    ToolInfo,
    Transcript,
    Usage,
)
from app.client.sdk import AsyncFerryman, Ferryman

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
