"""Every error answers `application/problem+json` (RFC 9457) with a stable `code`."""

from __future__ import annotations

import email.message
import logging
import math
import time
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import Counter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.db.pool import UNAVAILABLE_ERRORS
from app.domain import MODEL_NAME_PATTERN, MODEL_NAME_RULE, TOOL_NAME_PATTERN, TOOL_NAME_RULE
from app.errors import FerrymanError, LimitReached, ProblemCode, Unauthorized

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

_FASTAPI_BODY_ERROR = "There was an error parsing the body"

_HTTP_TITLES = {413: "Payload Too Large"}  # the RFC 9110 name; Python 3.11 has the old one

_HTTP_CODES = {
    400: ProblemCode.BAD_REQUEST,
    401: ProblemCode.AUTH_REQUIRED,
    404: ProblemCode.NOT_FOUND,
    405: ProblemCode.METHOD_NOT_ALLOWED,
    406: ProblemCode.NOT_ACCEPTABLE,
    413: ProblemCode.PAYLOAD_TOO_LARGE,
    415: ProblemCode.UNSUPPORTED_MEDIA_TYPE,
}
# The requests a limit of docs/tenants.md refused (429 OWNER_QUEUE_FULL, RATE_LIMITED).
LIMIT_REFUSALS = Counter(
    "ferryman_limit_refusals_total", "Requests a per-owner or per-key limit refused", ["code"]
)
# Errors named in the 422's `detail`; all of them are in its `errors`.
_DETAIL_ERRORS = 3


def problem(
    status: int,
    code: ProblemCode,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "code": str(code)}
    body["detail"] = detail
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _ferryman_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FerrymanError)
    headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
    if isinstance(exc, LimitReached):
        headers = {"Retry-After": str(exc.retry_after)}
        LIMIT_REFUSALS.labels(str(exc.code)).inc()
    if isinstance(exc, Unauthorized):
        headers = {"WWW-Authenticate": exc.challenge}
    return problem(exc.status, exc.code, exc.title, exc.detail, headers, **exc.extra)


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    raw = exc.errors()
    if any(err.get("type") == "json_invalid" for err in raw):
        return problem(
            400, ProblemCode.MALFORMED_JSON, "Bad Request", "the request body is not valid JSON"
        )
    if any(tuple(err.get("loc", ())) == ("body",) for err in raw):
        unsupported = _not_json(request.headers.get("content-type"))
        if unsupported is not None:
            return problem(
                415, ProblemCode.UNSUPPORTED_MEDIA_TYPE, "Unsupported Media Type", unsupported
            )
    errors = [
        {
            "field": field_name(err.get("loc", ())),
            "message": plain_message(err),
            "type": err["type"],
        }
        for err in raw
    ]
    named = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:_DETAIL_ERRORS])
    more = len(errors) - _DETAIL_ERRORS
    detail = named + (f"; and {more} more (see errors)" if more > 0 else "")
    return problem(
        422, ProblemCode.VALIDATION_ERROR, "Unprocessable Content", detail, errors=errors
    )


def _not_json(content_type: str | None) -> str | None:
    """Why a body with this Content-Type is refused (None if it is JSON: then the body itself
    was wrong)."""
    if content_type is None:
        return "the body needs `Content-Type: application/json`, and the request has none"
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    if message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    ):
        return None
    return f"the body must be JSON (`Content-Type: application/json`), not {content_type[:80]!r}"


def field_name(loc: Sequence[Any]) -> str:
    """`modelSettings.stop.1` for a pydantic location; `body` for the body as a whole."""
    parts = loc[1:] if loc and loc[0] in ("body", "query", "header", "path") else loc
    name = ".".join(str(part) for part in parts if not _is_validator_tag(part))
    return name or (str(loc[0]) if loc else "")


def _is_validator_tag(part: Any) -> bool:
    # pydantic adds the union member it tried (`function-after[...]`, `constrained-str`, `str`);
    # no field name has brackets or dashes.
    return isinstance(part, str) and (
        "[" in part or "-" in part or part in ("str", "int", "bool", "float", "none")
    )


def plain_message(err: Mapping[str, Any]) -> str:
    """The rule a value broke, in plain words (pydantic's own messages are for developers)."""
    ctx = err.get("ctx") or {}
    kind = err.get("type", "")
    if kind == "too_short" and isinstance(err.get("input"), str):
        kind = "string_too_short"  # min_length on a validated string is reported as a list's
    elif kind == "too_long" and isinstance(err.get("input"), str):
        kind = "string_too_long"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_RULES:
        return _PATTERN_RULES[ctx["pattern"]]
    template = _PLAIN.get(kind)
    if template is not None:
        try:
            return template.format(**ctx)
        except (KeyError, IndexError):
            pass
    message = str(err.get("msg", "is not valid"))
    return message.removeprefix("Value error, ")


# The patterns of the API's own fields, said as the rule they stand for: a regular expression
# tells most readers nothing.
_PATTERN_RULES = {MODEL_NAME_PATTERN: MODEL_NAME_RULE, TOOL_NAME_PATTERN: TOOL_NAME_RULE}

_PLAIN = {
    "missing": "is required",
    "extra_forbidden": "is not a field this request takes",
    "string_too_short": "must be at least {min_length} character(s) long",
    "string_too_long": "must be at most {max_length} characters long",
    "too_short": "must have at least {min_length} item(s)",
    "too_long": "must have at most {max_length} items",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be at least {ge}",
    "less_than": "must be less than {lt}",
    "less_than_equal": "must be at most {le}",
    "literal_error": "must be one of {expected}",
    "enum": "must be one of {expected}",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "dict_type": "must be a JSON object",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "list_type": "must be a list",
    "finite_number": "must be a finite number",
}


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        exc.headers = {**(exc.headers or {}), "Allow": _allowed_methods(request)}
    code = _HTTP_CODES.get(exc.status_code, ProblemCode.HTTP_ERROR)
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 400 and detail == _FASTAPI_BODY_ERROR:
        # FastAPI's answer to a body json.loads cannot read (bad UTF-8, too deep, huge numbers).
        code, detail = ProblemCode.MALFORMED_JSON, "the request body is not valid JSON"
    try:
        title = _HTTP_TITLES.get(exc.status_code) or HTTPStatus(exc.status_code).phrase
    except ValueError:
        title = detail
    return problem(exc.status_code, code, title, detail, dict(exc.headers or {}))


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method some route takes at this path. Starlette's 405 names only the methods of
    the first route whose path matched; RFC 9110 wants them all. Asks each route whether it
    would take the request with each method (the routing API, whatever the routes' nesting)."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    )


# A run of requests that found the database unavailable is one outage until none has for this
# many seconds: the next one after that starts another.
OUTAGE_QUIET = 5.0


class _RequestOutage:
    """Logs an outage as the requests meet it: a warning for the first request, and every
    later one only at debug (a busy API would log thousands of lines a minute). A request
    cannot tell that the database is back, only that none has failed for a while."""

    def __init__(self) -> None:
        self.last_failure = -math.inf

    def failed(self, exc: Exception) -> None:
        now = time.monotonic()
        began = now - self.last_failure > OUTAGE_QUIET
        self.last_failure = now
        if began:
            log.warning("database unavailable: %s", type(exc).__name__)
        else:
            log.debug("database still unavailable: %s", type(exc).__name__)


def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    request.app.state.database_outage.failed(exc)
    return problem(
        503,
        ProblemCode.DATABASE_UNAVAILABLE,
        "Service Unavailable",
        "the database cannot be reached right now; retry shortly",
        {"Retry-After": "1"},
    )


def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return problem(
        500, ProblemCode.INTERNAL_ERROR, "Internal Server Error", "an unexpected error occurred"
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(FerrymanError, _ferryman_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.state.database_outage = _RequestOutage()
    for error in UNAVAILABLE_ERRORS:
        app.add_exception_handler(error, _unavailable)
    app.add_exception_handler(Exception, _unexpected)
