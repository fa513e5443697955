"""The workbench: plain HTML, CSS and JavaScript modules from this package, no build step and
nothing from the internet. `/` is the page, `/assets/<file>` its files, `/favicon.ico` the icon.

Every answer carries a Content-Security-Policy that allows this origin's scripts, styles and
connections alone, and Trusted Types with no policy: Chromium refuses any string assigned as
HTML (`innerHTML` and friends), so a session's text can only ever reach the page as text."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import FastAPI, HTTPException
from fastapi.responses import Response

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load: an upgraded server serves its own page, never a stale module.
    "Cache-Control": "no-cache",
}


def assets() -> list[str]:
    """The files the page may load: every servable file of this package."""
    return sorted(
        entry.name
        for entry in resources.files(__name__).iterdir()
        if entry.is_file() and any(entry.name.endswith(ext) for ext in CONTENT_TYPES)
    )


@cache
def _read(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


def _serve(name: str) -> Response:
    suffix = name[name.rfind(".") :]
    return Response(_read(name), media_type=CONTENT_TYPES[suffix], headers=HEADERS)


def install(app: FastAPI) -> None:
    allowed = frozenset(assets())

    @app.get("/", include_in_schema=False)
    async def workbench() -> Response:
        return _serve("index.html")

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return _serve("favicon.svg")

    @app.get("/assets/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in allowed:
            raise HTTPException(404, "no such asset")
        return _serve(name)
