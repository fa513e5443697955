"""The SDK's errors: `ApiError` (one subclass per status family) for a problem+json answer, and
`FerrymanConnectionError` when no answer came at all."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httpx

# A proxy's error page can be long; the message keeps its start.
_MAX_DETAIL_CHARS = 1000


@dataclass(frozen=True)
class FieldError:
    """One entry of a 422's `errors`: the field (dotted, camelCase as sent) and what is wrong."""

    field: str
    message: str
    type: str = ""

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class ApiError(Exception):
    """An error answer (4xx/5xx) of the Ferryman API, from its problem+json body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.code = str(problem.get("code") or f"HTTP_{status}")
        self.title = str(problem.get("title") or _phrase(status))
        self.detail = str(problem.get("detail") or "")
        self.errors = _field_errors(problem.get("errors"))
        super().__init__(self._message())

    def _message(self) -> str:
        head = f"{self.status} {self.code}: {self.detail or self.title}"
        # Each field at fault, unless the detail already names it (newer servers do).
        named = [str(e) for e in self.errors if str(e) not in self.detail]
        return "; ".join([head, *named])

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later (429, 5xx)."""
        return self.status == 429 or self.status >= 500


class BadRequestError(ApiError):
    """400: a malformed body, cursor or page token."""


class AuthenticationError(ApiError):
    """401: no API key, or one the server does not know."""


class NotFoundError(ApiError):
    """404: no such session for this owner (also another owner's, or a deleted one)."""


class ConflictError(ApiError):
    """409: e.g. SESSION_ALREADY_TERMINAL, IDEMPOTENCY_KEY_REUSED, APPROVAL_NOT_PENDING."""


class PayloadTooLargeError(ApiError):
    """413: the body is over the server's FERRYMAN_MAX_BODY_BYTES."""


class UnsupportedMediaTypeError(ApiError):
    """415: the body is not JSON."""


class UnprocessableEntityError(ApiError):
    """422 VALIDATION_ERROR: `errors` names each field at fault."""


class RateLimitError(ApiError):
    """429: e.g. TOO_MANY_STREAMS; retry later."""


class InternalServerError(ApiError):
    """5xx other than 503."""


class ServiceUnavailableError(ApiError):
    """503: e.g. DATABASE_UNAVAILABLE; retry shortly."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    415: UnsupportedMediaTypeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def error_class(status: int) -> type[ApiError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return InternalServerError if status >= 500 else ApiError


def api_error(response: httpx.Response) -> ApiError:
    """The error for a 4xx/5xx answer whose body has been read: problem+json, or (from a proxy)
    anything else, whose text becomes the detail."""
    problem = _problem(response.text)
    return error_class(response.status_code)(response.status_code, problem)


def _problem(text: str) -> dict[str, Any]:
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"detail": text.strip()[:_MAX_DETAIL_CHARS]}


def _field_errors(raw: Any) -> list[FieldError]:
    if not isinstance(raw, list):
        return []
    return [
        FieldError(str(e.get("field", "")), str(e.get("message", "")), str(e.get("type", "")))
        for e in raw
        if isinstance(e, dict)
    ]


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


class FerrymanConnectionError(ConnectionError):
    """The server could not be reached (refused, unresolvable, timed out, cut mid-answer)."""

    def __init__(self, base_url: str, reason: str) -> None:
        super().__init__(
            f"cannot reach Ferryman at {base_url}: {reason};"
            " is `ferryman serve` running? (FERRYMAN_URL)"
        )
        self.base_url = base_url
        self.reason = reason


def connection_error(base_url: str, exc: httpx.TransportError) -> FerrymanConnectionError:
    return FerrymanConnectionError(base_url, _reason(exc))


def _reason(exc: httpx.TransportError) -> str:
    """A short reason in lower case: `connection refused`, whether the cause came wrapped by
    asyncio (`All connection attempts failed`) or not (`[Errno 111] Connection refused`)."""
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    cause = _os_error(exc)
    if cause is not None and isinstance(cause.errno, int) and cause.errno > 0:
        text = os.strerror(cause.errno)
    elif cause is not None and cause.strerror:
        text = cause.strerror
    else:
        text = str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


def _os_error(exc: BaseException) -> OSError | None:
    """The innermost OSError that says what happened (one with an errno)."""
    found: OSError | None = None
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno is not None:
            found = seen
        seen = seen.__cause__ or seen.__context__
    return found
