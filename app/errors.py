"""One exception type per failure the contract names; the API maps each to problem+json."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ProblemCode(StrEnum):
    """Every `code` a problem+json answer can carry: stable, for clients to switch on (the
    OpenAPI document lists them as the `Problem.code` enum)."""

    BAD_REQUEST = "BAD_REQUEST"
    MALFORMED_JSON = "MALFORMED_JSON"
    INVALID_CURSOR = "INVALID_CURSOR"
    INVALID_PAGE_TOKEN = "INVALID_PAGE_TOKEN"
    AUTH_REQUIRED = "AUTH_REQUIRED"
    INVALID_API_KEY = "INVALID_API_KEY"
    METRICS_TOKEN_REQUIRED = "METRICS_TOKEN_REQUIRED"
    TOKEN_INVALID = "TOKEN_INVALID"
    TOKEN_EXPIRED = "TOKEN_EXPIRED"
    TOKEN_KEYS_UNAVAILABLE = "TOKEN_KEYS_UNAVAILABLE"
    CROSS_SITE_REQUEST = "CROSS_SITE_REQUEST"
    LOCAL_MODE_NOT_LOCAL = "LOCAL_MODE_NOT_LOCAL"
    NOT_FOUND = "NOT_FOUND"
    SESSION_NOT_FOUND = "SESSION_NOT_FOUND"
    ASSISTANT_NOT_FOUND = "ASSISTANT_NOT_FOUND"
    KEY_NOT_FOUND = "KEY_NOT_FOUND"
    ASSISTANT_LIMIT_REACHED = "ASSISTANT_LIMIT_REACHED"
    SCHEDULE_NOT_FOUND = "SCHEDULE_NOT_FOUND"
    SCHEDULE_LIMIT_REACHED = "SCHEDULE_LIMIT_REACHED"
    SCHEDULE_CRON_INVALID = "SCHEDULE_CRON_INVALID"
    SCHEDULE_TIMEZONE_INVALID = "SCHEDULE_TIMEZONE_INVALID"
    WEBHOOK_NOT_FOUND = "WEBHOOK_NOT_FOUND"
    WEBHOOK_LIMIT_REACHED = "WEBHOOK_LIMIT_REACHED"
    WEBHOOK_TARGET_REFUSED = "WEBHOOK_TARGET_REFUSED"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
    SESSION_ALREADY_TERMINAL = "SESSION_ALREADY_TERMINAL"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    APPROVAL_NOT_PENDING = "APPROVAL_NOT_PENDING"
    SESSION_NOT_COMPACTABLE = "SESSION_NOT_COMPACTABLE"
    CLIENT_TOOL_NOT_PENDING = "CLIENT_TOOL_NOT_PENDING"
    FORK_SEQ_OUT_OF_RANGE = "FORK_SEQ_OUT_OF_RANGE"
    FORK_NOT_USER_MESSAGE = "FORK_NOT_USER_MESSAGE"
    FORK_TOO_LONG = "FORK_TOO_LONG"
    DELEGATE_CYCLE = "DELEGATE_CYCLE"
    TOOL_NOT_ALLOWED = "TOOL_NOT_ALLOWED"
    MODEL_NOT_ALLOWED = "MODEL_NOT_ALLOWED"
    APPROVAL_SEPARATE = "APPROVAL_SEPARATE"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    HOST_NOT_ALLOWED = "HOST_NOT_ALLOWED"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    TOO_MANY_STREAMS = "TOO_MANY_STREAMS"
    OWNER_QUEUE_FULL = "OWNER_QUEUE_FULL"
    RATE_LIMITED = "RATE_LIMITED"
    HTTP_ERROR = "HTTP_ERROR"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
    NOT_READY = "NOT_READY"
    # The Agent Protocol (app/protocols/agent_protocol).
    THREAD_EXISTS = "THREAD_EXISTS"
    THREAD_BUSY = "THREAD_BUSY"
    RUN_NOT_FOUND = "RUN_NOT_FOUND"
    NO_PENDING_INTERRUPT = "NO_PENDING_INTERRUPT"
    INPUT_NOT_SUPPORTED = "INPUT_NOT_SUPPORTED"
    NOT_SERVED = "NOT_SERVED"
    ASSISTANT_EXISTS = "ASSISTANT_EXISTS"


class FerrymanError(Exception):
    status: int = 400
    code: ProblemCode = ProblemCode.BAD_REQUEST
    title: str = "Bad Request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class NotFound(FerrymanError):
    status, code, title = 404, ProblemCode.NOT_FOUND, "Not Found"


class SessionNotFound(NotFound):
    code = ProblemCode.SESSION_NOT_FOUND

    def __init__(self) -> None:
        super().__init__("no such session")


class AssistantNotFound(NotFound):
    code = ProblemCode.ASSISTANT_NOT_FOUND

    def __init__(self, detail: str = "no such assistant") -> None:
        super().__init__(detail)


class KeyNotFound(NotFound):
    code = ProblemCode.KEY_NOT_FOUND

    def __init__(self) -> None:
        super().__init__("no such key, or it is revoked")


class AssistantLimitReached(FerrymanError):
    status, code, title = 409, ProblemCode.ASSISTANT_LIMIT_REACHED, "Conflict"


class ScheduleNotFound(NotFound):
    code = ProblemCode.SCHEDULE_NOT_FOUND

    def __init__(self) -> None:
        super().__init__("no such schedule")


class ScheduleLimitReached(FerrymanError):
    status, code, title = 409, ProblemCode.SCHEDULE_LIMIT_REACHED, "Conflict"


def field_problem(field: str, detail: str, kind: str) -> dict[str, Any]:
    """The `errors` of a 422 that names one field, with its own code."""
    return {"errors": [{"field": field, "message": detail, "type": kind}]}


class ScheduleCronInvalid(FerrymanError):
    status, code, title = 422, ProblemCode.SCHEDULE_CRON_INVALID, "Unprocessable Content"

    def __init__(self, detail: str) -> None:
        super().__init__(f"cron: {detail}", **field_problem("cron", detail, "cron_invalid"))


class ScheduleTimezoneInvalid(FerrymanError):
    status, code, title = 422, ProblemCode.SCHEDULE_TIMEZONE_INVALID, "Unprocessable Content"

    def __init__(self, detail: str) -> None:
        super().__init__(
            f"timezone: {detail}", **field_problem("timezone", detail, "timezone_invalid")
        )


class WebhookNotFound(NotFound):
    code = ProblemCode.WEBHOOK_NOT_FOUND

    def __init__(self) -> None:
        super().__init__("no such webhook")


class WebhookLimitReached(FerrymanError):
    status, code, title = 409, ProblemCode.WEBHOOK_LIMIT_REACHED, "Conflict"


class WebhookTargetRefused(FerrymanError):
    """A webhook URL whose host is private, link-local or loopback (and not allowed by
    FERRYMAN_WEBHOOK_ALLOW_HOSTS), or not an http(s) URL."""

    status, code, title = 422, ProblemCode.WEBHOOK_TARGET_REFUSED, "Unprocessable Content"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, errors=[{"field": "url", "message": detail, "type": "refused"}])


class SessionAlreadyTerminal(FerrymanError):
    status, code, title = 409, ProblemCode.SESSION_ALREADY_TERMINAL, "Conflict"

    def __init__(self, status: str) -> None:
        super().__init__(f"session is already {status}", sessionStatus=status)


class IdempotencyKeyReused(FerrymanError):
    status, code, title = 409, ProblemCode.IDEMPOTENCY_KEY_REUSED, "Conflict"

    def __init__(self) -> None:
        super().__init__(
            "this Idempotency-Key was used with a different request body; use a new key"
        )


class ApprovalNotPending(FerrymanError):
    status, code, title = 409, ProblemCode.APPROVAL_NOT_PENDING, "Conflict"


class SessionNotCompactable(FerrymanError):
    status, code, title = 409, ProblemCode.SESSION_NOT_COMPACTABLE, "Conflict"


class ClientToolNotPending(FerrymanError):
    status, code, title = 409, ProblemCode.CLIENT_TOOL_NOT_PENDING, "Conflict"


def _at_seq_errors(detail: str, kind: str) -> list[dict[str, str]]:
    """A fork's `atSeq` at fault, listed as a validation error's fields are."""
    return [{"field": "atSeq", "message": detail, "type": kind}]


class DelegateCycle(FerrymanError):
    status, code, title = 422, ProblemCode.DELEGATE_CYCLE, "Unprocessable Content"

    def __init__(self, cycle: list[str]) -> None:
        detail = "delegates would make a cycle of assistants: " + " -> ".join(cycle)
        errors = [{"field": "delegates", "message": detail, "type": "cycle"}]
        super().__init__(detail, cycle=cycle, errors=errors)


class ToolNotAllowed(FerrymanError):
    """The caller's key may not use these tools (its policy's `tools`, docs/tenants.md)."""

    status, code, title = 403, ProblemCode.TOOL_NOT_ALLOWED, "Forbidden"

    def __init__(self, detail: str, tools: list[str]) -> None:
        super().__init__(detail, tools=tools)


class ModelNotAllowed(FerrymanError):
    """The caller's key may not use this model (its policy's `models`, or the scripted model
    in keys mode without FERRYMAN_SCRIPTED_MODEL)."""

    status, code, title = 403, ProblemCode.MODEL_NOT_ALLOWED, "Forbidden"

    def __init__(self, detail: str, model: str) -> None:
        super().__init__(detail, model=model)


class ApprovalSeparate(FerrymanError):
    """FERRYMAN_APPROVAL_SEPARATE: the key that created a session may not decide its calls."""

    status, code, title = 403, ProblemCode.APPROVAL_SEPARATE, "Forbidden"

    def __init__(self) -> None:
        super().__init__(
            "the key that created this session may not decide its approvals"
            " (FERRYMAN_APPROVAL_SEPARATE): another key, an approver, must"
        )


class ForkSeqOutOfRange(FerrymanError):
    status, code, title = 422, ProblemCode.FORK_SEQ_OUT_OF_RANGE, "Unprocessable Content"

    def __init__(self, at_seq: int, last_seq: int) -> None:
        detail = f"atSeq {at_seq} is past the session's last committed event ({last_seq})"
        super().__init__(detail, lastSeq=last_seq, errors=_at_seq_errors(detail, "out_of_range"))


class ForkTooLong(FerrymanError):
    status, code, title = 422, ProblemCode.FORK_TOO_LONG, "Unprocessable Content"

    def __init__(self, at_seq: int, limit: int) -> None:
        detail = f"atSeq {at_seq} would copy more than {limit} events (MAX_FORK_EVENTS)"
        super().__init__(detail, limit=limit, errors=_at_seq_errors(detail, "too_long"))


class ForkNotUserMessage(FerrymanError):
    status, code, title = 422, ProblemCode.FORK_NOT_USER_MESSAGE, "Unprocessable Content"

    def __init__(self, at_seq: int, event_type: str) -> None:
        detail = (
            f"a fork with a message replaces a user message, and event {at_seq} is a"
            f" {event_type}: fork at the seq of a user_message"
        )
        errors = _at_seq_errors(detail, "not_a_user_message")
        super().__init__(detail, eventType=event_type, errors=errors)


class InvalidCursor(FerrymanError):
    status, code, title = 400, ProblemCode.INVALID_CURSOR, "Bad Request"


class InvalidPageToken(FerrymanError):
    status, code, title = 400, ProblemCode.INVALID_PAGE_TOKEN, "Bad Request"


class Unauthorized(FerrymanError):
    status, code, title = 401, ProblemCode.AUTH_REQUIRED, "Unauthorized"
    # The WWW-Authenticate challenge (RFC 6750): a bad token says so with `invalid_token`.
    challenge = "Bearer"


class AuthRequired(Unauthorized):
    code = ProblemCode.AUTH_REQUIRED


class InvalidApiKey(Unauthorized):
    code = ProblemCode.INVALID_API_KEY


class MetricsTokenRequired(FerrymanError):
    """/metrics in keys or jwt mode with no FERRYMAN_METRICS_TOKEN: its counts are every
    owner's, so no tenant's key reads them."""

    status, code, title = 403, ProblemCode.METRICS_TOKEN_REQUIRED, "Forbidden"


class TokenInvalid(Unauthorized):
    code, challenge = ProblemCode.TOKEN_INVALID, 'Bearer error="invalid_token"'


class TokenExpired(Unauthorized):
    code, challenge = ProblemCode.TOKEN_EXPIRED, 'Bearer error="invalid_token"'


class TokenKeysUnavailable(Unauthorized):
    """The identity provider's keys cannot be had: the token may be good, and is not checked."""

    code = ProblemCode.TOKEN_KEYS_UNAVAILABLE


class TooManyStreams(FerrymanError):
    status, code, title = 429, ProblemCode.TOO_MANY_STREAMS, "Too Many Requests"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this owner already has {limit} open streams on this server"
            " (FERRYMAN_MAX_STREAMS_PER_OWNER); close one, then retry",
            limit=limit,
        )


class LimitReached(FerrymanError):
    """A limit of docs/tenants.md refused the request: 429 with `Retry-After`."""

    status, code, title = 429, ProblemCode.RATE_LIMITED, "Too Many Requests"

    def __init__(self, detail: str, retry_after: int, **extra: Any) -> None:
        super().__init__(detail, **extra)
        self.retry_after = retry_after


class OwnerQueueFull(LimitReached):
    code = ProblemCode.OWNER_QUEUE_FULL

    # A queued session waits for a worker: its owner's queue seldom moves within a second.
    RETRY_AFTER = 5

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this owner already has {limit} sessions queued (FERRYMAN_OWNER_MAX_QUEUED);"
            " retry when some have started",
            self.RETRY_AFTER,
            limit=limit,
        )


class RateLimited(LimitReached):
    code = ProblemCode.RATE_LIMITED

    def __init__(self, action: str, limit: int, retry_after: int) -> None:
        super().__init__(
            f"this key may send {limit} {action} a minute; retry in {retry_after} s",
            retry_after,
            limit=limit,
        )


class ThreadExists(FerrymanError):
    status, code, title = 409, ProblemCode.THREAD_EXISTS, "Conflict"


class ThreadBusy(FerrymanError):
    status, code, title = 409, ProblemCode.THREAD_BUSY, "Conflict"


class RunNotFound(NotFound):
    code = ProblemCode.RUN_NOT_FOUND

    def __init__(self) -> None:
        super().__init__("no such run on this thread")


class NoPendingInterrupt(FerrymanError):
    status, code, title = 409, ProblemCode.NO_PENDING_INTERRUPT, "Conflict"


class InputNotSupported(FerrymanError):
    status, code, title = 422, ProblemCode.INPUT_NOT_SUPPORTED, "Unprocessable Content"

    def __init__(self, detail: str, field: str = "body") -> None:
        errors = [{"field": field, "message": detail, "type": "not_supported"}]
        super().__init__(detail, errors=errors)


class NotServed(FerrymanError):
    status, code, title = 501, ProblemCode.NOT_SERVED, "Not Implemented"


class AssistantExists(FerrymanError):
    status, code, title = 409, ProblemCode.ASSISTANT_EXISTS, "Conflict"

    def __init__(self, assistant_id: str) -> None:
        super().__init__(
            f"assistant {assistant_id} exists; leave assistant_id out for a new one",
            assistantId=assistant_id,
        )


class FenceRefused(Exception):
    """A run write was refused: the writer no longer holds the session's lease."""
