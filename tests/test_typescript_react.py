"""The TypeScript guide's React example (docs/examples/react-ferryman-client), built on
`@ferryman/client` (clients/typescript, compiled by tsc) and bundled by esbuild with React (as
tests/js/agent_protocol/package-lock.json pins them), in Debian's Chromium against a real API
server and worker: a session started from the page streams its reply in token by token, the
owner's list shows sessions made elsewhere live, a cancel of a finished session is taken as
"ended already", and the list carries on after the API server restarts.

The page is served at the API's own origin (`/react-client/`, answered by the browser context
from the bundle), so it needs no CORS. Needs node >= 20, npm and Chromium; without them the
module skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx
import pytest

from tests.agent_protocol_js import (
    PACKAGE,
    Stack,
    bundle_tab,
    record_texts,
    running_stack,
    sdk_node,
)
from tests.npm import node_tools
from tests.test_workbench import browser  # noqa: F401 - Debian's Chromium, one per module

with contextlib.suppress(ImportError):  # the test extra installs it; else `browser` skips
    from playwright.sync_api import expect

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [pytest.mark.timeout(300), pytest.mark.once]

WHAT = "the TypeScript client's React page in a real browser"
CLIENT = Path(PACKAGE).parents[2] / "clients" / "typescript"
PAGE_PATH = "/react-client/"
REPLY = "One, two, three, four, five, six, seven, eight."
RECORD_TEXTS = record_texts(".message.assistant .text")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built (dist/), then the example bundled: index.html and app.js."""
    client = node_tools(CLIENT, WHAT, (20, 0))
    tsc = subprocess.run(
        [str(CLIENT / "node_modules" / ".bin" / "tsc"), "--project", "tsconfig.json"],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert tsc.returncode == 0, f"{tsc.stdout}\n{tsc.stderr}"
    node = sdk_node(WHAT)
    out = tmp_path_factory.mktemp("react-client")
    built = subprocess.run(
        [client.node, "build-react.mjs", out, "react-ferryman-client"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert node.node and built.returncode == 0, f"{built.stdout}\n{built.stderr}"
    return out


@pytest.fixture(scope="module")
def served(isolated_db: str) -> Iterator[Stack]:
    with running_stack(isolated_db) as stack:
        yield stack


@pytest.fixture
def page(
    browser: Browser,  # noqa: F811 - the fixture imported above
    bundle: Path,
    served: Stack,
) -> Iterator[Page]:
    """A tab on the page at the API's origin, live."""
    with bundle_tab(browser, bundle, served.api.url, PAGE_PATH, RECORD_TEXTS) as tab:
        tab.goto(f"{served.api.url}{PAGE_PATH}?key={served.key}")
        expect(tab.locator(".connection")).to_have_text("live")
        yield tab


def api(served: Stack) -> httpx.Client:
    headers = {"Authorization": f"Bearer {served.key}"}
    return httpx.Client(base_url=served.api.url, headers=headers, timeout=30)


def test_a_session_started_on_the_page_streams_its_reply(page: Page) -> None:
    page.locator("input[name=prompt]").fill("Count, please.")
    page.locator("input[name=reply]").fill(REPLY)
    page.get_by_role("button", name="Start").click()
    conversation = page.locator(".conversation")
    expect(conversation.locator(".message.user .text")).to_have_text(["Count, please."])
    expect(conversation.locator(".message.assistant .text")).to_have_text([REPLY])
    expect(conversation).to_have_attribute("data-status", "succeeded")
    texts: list[str] = page.evaluate("window.__texts")
    partial = [t for t in texts if REPLY.startswith(t) and t != REPLY]
    assert len(partial) >= 2, texts
    expect(page.locator(".session[data-status=succeeded]")).to_have_count(1)


def test_the_list_is_live_across_an_api_restart(page: Page, served: Stack) -> None:
    with api(served) as http:
        made = http.post("/api/agent", json={"prompt": "hi", "script": [{"text": "done"}]})
        assert made.status_code == 201, made.text
        first = made.json()["id"]
        row = page.locator(f".session[data-id='{first}']")
        expect(row).to_have_attribute("data-status", "succeeded")
        # 409 SESSION_ALREADY_TERMINAL: taken as ended, the client reading the session again;
        # both are answered before the restart below (a restart that cut the second read off
        # would show its failure on the page).
        session_path = f"/api/agent/{first}"
        with (
            page.expect_response(
                lambda response: (
                    response.request.method == "GET" and urlsplit(response.url).path == session_path
                )
            ),
            page.expect_response(lambda response: "/cancel" in response.url),
        ):
            row.locator(".cancel").click()
        served.restart_api()
        expect(page.locator(".connection")).to_have_text("live")
        later = http.post("/api/agent", json={"title": "after the restart"})
        assert later.status_code == 201, later.text
        expect(page.locator(f".session[data-id='{later.json()['id']}']")).to_contain_text(
            "after the restart"
        )
    expect(page.locator(".error")).to_have_count(0)
