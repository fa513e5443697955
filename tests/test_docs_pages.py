"""/docs (Swagger UI) and /redoc (ReDoc) under the workbench's Content-Security-Policy, with
`frame-ancestors 'none'`: they render in a real Chromium (Playwright, /usr/bin/chromium as
tests/test_workbench.py), from this server's own files (this machine reaches no CDN), with no
violation of the policy but those the page was meant to refuse (ReDoc's logo from its CDN)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.web import POLICY, REDOC_POLICY
from tests.support import ServerProcess, missing, running

CHROMIUM = os.environ.get("FERRYMAN_CHROMIUM", "/usr/bin/chromium")

try:
    from playwright.sync_api import Browser, sync_playwright
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None

# Reports every violation of the page's policy to the console, before any script of the page.
REPORT = (
    "document.addEventListener('securitypolicyviolation', e => console.log("
    "'csp-violation', e.violatedDirective, e.blockedURI))"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if sync_playwright is None:
        missing("playwright is not installed: pip install -e '.[test]'", "the docs pages' test")
    if not os.access(CHROMIUM, os.X_OK):
        missing(f"no Chromium at {CHROMIUM}: apt-get install -y chromium", "the docs pages' test")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def keyed(isolated_db: str) -> Iterator[ServerProcess]:
    with running(ServerProcess(isolated_db, env={"FERRYMAN_AUTH": "keys"})) as server:
        yield server


def test_the_pages_carry_the_workbench_policy(keyed: ServerProcess) -> None:
    for path, policy in (("/", POLICY), ("/docs", POLICY), ("/redoc", REDOC_POLICY)):
        page = httpx.get(keyed.url + path, timeout=10)
        assert page.status_code == 200
        assert page.headers["content-security-policy"] == policy
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in policy and "script-src 'self'" in policy
        assert "<script>" not in page.text  # no inline script: the policy would refuse it
    assert "'unsafe-inline'" not in REDOC_POLICY and "'unsafe-eval'" not in REDOC_POLICY


def render(
    browser: Browser, server: ServerProcess, path: str, selector: str
) -> tuple[int, list[str], list[str]]:
    """How many `selector` elements the page at `path` shows once rendered, its policy's
    violations and its page errors; every request it made went to `server`."""
    page = browser.new_page()
    console: list[str] = []
    errors: list[str] = []
    page.on("console", lambda m: console.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    elsewhere: list[str] = []

    def route(r: Any) -> None:
        if not r.request.url.startswith(server.url + "/"):
            elsewhere.append(r.request.url)
            r.abort()
        else:
            r.continue_()

    page.route("**/*", route)
    page.add_init_script(REPORT)
    try:
        page.goto(server.url + path)
        page.wait_for_selector(selector, timeout=30_000)
        shown = page.locator(selector).count()
    finally:
        page.close()
    violations = [c for c in console if c.startswith("csp-violation")]
    assert elsewhere == [], elsewhere  # the policy stops the rest before a request
    return shown, violations, errors


def test_swagger_ui_renders_under_the_policy(browser: Browser, keyed: ServerProcess) -> None:
    shown, violations, errors = render(browser, keyed, "/docs", ".opblock")
    assert shown > 20  # every operation
    assert violations == [] and errors == []


def test_redoc_renders_under_the_policy(browser: Browser, keyed: ServerProcess) -> None:
    shown, violations, errors = render(browser, keyed, "/redoc", "[data-section-id]")
    assert shown > 20
    assert errors == []
    # Refused as meant: its logo (its CDN), an icon as a data: URL, perfect-scrollbar's
    # inline stylesheet; nothing it needs to render.
    for violation in violations:
        assert violation.split()[1] in {"img-src", "style-src-elem"}, violation
