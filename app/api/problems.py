"""Every error answers `application/problem+json` (RFC 9457) with a stable `code`."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.db.pool import UNAVAILABLE_ERRORS
from app.errors import FerrymanError

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

_FASTAPI_BODY_ERROR = "There was an error parsing the body"

_HTTP_TITLES = {413: "Payload Too Large"}  # the RFC 9110 name; Python 3.11 has the old one

_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "AUTH_REQUIRED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
}


def problem(
    status: int,
    code: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": "about:blank", "title": title, "status": status, "code": code}
    body["detail"] = detail
    body.update(extra)
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _ferryman_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FerrymanError)
    headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
    if exc.status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    return problem(exc.status, exc.code, exc.title, exc.detail, headers, **exc.extra)


def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {
            "field": ".".join(str(part) for part in err.get("loc", ()) if part != "body"),
            "message": err.get("msg", ""),
            "type": err.get("type", ""),
        }
        for err in exc.errors()
    ]
    if any(err["type"] == "json_invalid" for err in errors):
        return problem(400, "MALFORMED_JSON", "Bad Request", "the request body is not valid JSON")
    return problem(
        422, "VALIDATION_ERROR", "Unprocessable Content", "the request is not valid", errors=errors
    )


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        exc.headers = {**(exc.headers or {}), "Allow": _allowed_methods(request)}
    code = _HTTP_CODES.get(exc.status_code, f"HTTP_{exc.status_code}")
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 400 and detail == _FASTAPI_BODY_ERROR:
        # FastAPI's answer to a body json.loads cannot read (bad UTF-8, too deep, huge numbers).
        code, detail = "MALFORMED_JSON", "the request body is not valid JSON"
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


def _unavailable(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable: %s", type(exc).__name__)
    return problem(
        503,
        "DATABASE_UNAVAILABLE",
        "Service Unavailable",
        "the database cannot be reached right now; retry shortly",
        {"Retry-After": "1"},
    )


def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return problem(500, "INTERNAL_ERROR", "Internal Server Error", "an unexpected error occurred")


def install(app: FastAPI) -> None:
    app.add_exception_handler(FerrymanError, _ferryman_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for error in UNAVAILABLE_ERRORS:
        app.add_exception_handler(error, _unavailable)
    app.add_exception_handler(Exception, _unexpected)
