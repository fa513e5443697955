"""The workbench: plain HTML, CSS and JavaScript modules from this package, no build step and
nothing from the internet. `/` is the page, `/assets/<file>` its files, `/favicon.ico` the icon.
`/docs` (Swagger UI) and `/redoc` (ReDoc) are pages of the same kind: their scripts and styles
are fastapi-offline's copies (`/static-offline-docs/`), started by a file of this package, no
inline script.

Every answer carries a Content-Security-Policy that allows this origin's scripts, styles and
connections alone, and Trusted Types with no policy: Chromium refuses any string assigned as
HTML (`innerHTML` and friends), so a session's text can only ever reach the page as text."""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

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
# /redoc's, the same but for two things ReDoc needs to render at all: its styles
# (styled-components) go into <style> elements it makes empty and fills through the CSSOM, which
# no CSP governs, so an empty one is allowed by its hash (of ""), any other inline style still
# refused; and it writes its (Markdown-rendered) descriptions as HTML strings, which Trusted
# Types refuses: off there. Those descriptions are this server's OpenAPI document, no
# tenant's text, and the policy's other lines (no inline or foreign script, no connection
# elsewhere, no framing) hold. Its search (a blob: worker) is off.
EMPTY_STYLE = "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
REDOC_POLICY = "; ".join(
    f"style-src 'self' {EMPTY_STYLE}" if line == "style-src 'self'" else line
    for line in POLICY.split("; ")
    if not line.startswith(("require-trusted-types-for", "trusted-types"))
)
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load: an upgraded server serves its own page, never a stale module.
    "Cache-Control": "no-cache",
}


# Where fastapi-offline serves Swagger UI's and ReDoc's files (app.main mounts them).
DOCS_STATIC = "/static-offline-docs"
_SWAGGER_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - Swagger UI</title>
<link rel="icon" href="{root}/favicon.ico">
<link rel="stylesheet" href="{root}{static}/swagger-ui.css"></head>
<body><div id="swagger-ui" data-openapi-url="{root}/openapi.json"></div>
<script src="{root}{static}/swagger-ui-bundle.js"></script>
<script src="{root}/assets/docs.js"></script></body></html>
"""
# ReDoc starts itself from its element: no script of ours.
_REDOC_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} - ReDoc</title>
<link rel="icon" href="{root}/favicon.ico"></head>
<body><redoc spec-url="{root}/openapi.json" disable-search></redoc>
<script src="{root}{static}/redoc.standalone.js"></script></body></html>
"""


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

    def page(template: str, request: Request, policy: str = POLICY) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        html = template.format(title=app.title, root=root, static=DOCS_STATIC)
        return HTMLResponse(html, headers={**HEADERS, "Content-Security-Policy": policy})

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return page(_SWAGGER_PAGE, request)

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return page(_REDOC_PAGE, request, REDOC_POLICY)

    @app.get("/assets/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        if name not in allowed:
            raise HTTPException(404, "no such asset")
        return _serve(name)
