"""One exception type per failure the contract names; the API maps each to problem+json."""

from __future__ import annotations

from typing import Any


class FerrymanError(Exception):
    status: int = 400
    code: str = "BAD_REQUEST"
    title: str = "Bad Request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(FerrymanError):
    status, code, title = 404, "NOT_FOUND", "Not Found"


class SessionNotFound(NotFound):
    code = "SESSION_NOT_FOUND"

    def __init__(self) -> None:
        super().__init__("no such session")


class SessionAlreadyTerminal(FerrymanError):
    status, code, title = 409, "SESSION_ALREADY_TERMINAL", "Conflict"

    def __init__(self, status: str) -> None:
        super().__init__(f"session is already {status}", sessionStatus=status)


class IdempotencyKeyReused(FerrymanError):
    status, code, title = 409, "IDEMPOTENCY_KEY_REUSED", "Conflict"

    def __init__(self) -> None:
        super().__init__(
            "this Idempotency-Key was used with a different request body; use a new key"
        )


class ApprovalNotPending(FerrymanError):
    status, code, title = 409, "APPROVAL_NOT_PENDING", "Conflict"


class InvalidCursor(FerrymanError):
    status, code, title = 400, "INVALID_CURSOR", "Bad Request"


class InvalidPageToken(FerrymanError):
    status, code, title = 400, "INVALID_PAGE_TOKEN", "Bad Request"


class AuthRequired(FerrymanError):
    status, code, title = 401, "AUTH_REQUIRED", "Unauthorized"


class InvalidApiKey(FerrymanError):
    status, code, title = 401, "INVALID_API_KEY", "Unauthorized"


class PayloadTooLarge(FerrymanError):
    status, code, title = 413, "PAYLOAD_TOO_LARGE", "Payload Too Large"


class TooManyStreams(FerrymanError):
    status, code, title = 429, "TOO_MANY_STREAMS", "Too Many Requests"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this owner already has {limit} open streams on this server"
            " (FERRYMAN_MAX_STREAMS_PER_OWNER); close one, then retry",
            limit=limit,
        )


class DatabaseUnavailable(FerrymanError):
    status, code, title = 503, "DATABASE_UNAVAILABLE", "Service Unavailable"


class FenceRefused(Exception):
    """A run write was refused: the writer no longer holds the session's lease."""
