"""The guide's React example (docs/examples/react-usestream), built on the `useStream` hook of
`@langchain/langgraph-sdk/react` and bundled here by esbuild (both from the npm registry, as
tests/js/agent_protocol/package-lock.json pins them), in Debian's Chromium against a real
`ferryman serve` and `ferryman worker`: the reply streams in token by token, a tool call shows as
its card, the agent's question is answered with a click, and the page carries on after the API
server restarts, both with the page open (the SDK reconnects with the last event id it saw) and
after a reload (useStream's reconnectOnMount joins the run's stream again).

The page is served at the API's own origin (`/react-example/`, answered by the browser context
from the bundle, as a site and its API behind one reverse proxy would be): the API sends no
CORS headers, and a page of the same origin needs none.

Needs node >= 20 and npm (tests/agent_protocol_js.py) and Chromium at /usr/bin/chromium; without
them the module skips, except under CI=true, where it fails.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import httpx
import pytest

from tests.agent_protocol_js import (
    PACKAGE,
    Stack,
    bundle_tab,
    record_texts,
    running_stack,
    scripted_thread,
    sdk_node,
)
from tests.test_workbench import browser  # noqa: F401 - Debian's Chromium, one per module

with contextlib.suppress(ImportError):  # the test extra installs it; else `browser` skips
    from playwright.sync_api import expect

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

pytestmark = [pytest.mark.timeout(300), pytest.mark.once]

WHAT = "the React useStream page's tests in a real browser"
# Long enough for a restart and the SDK's reconnect delays (1 s, then 2 s, with jitter).
RECONNECT_MS = 30_000
PAGE_PATH = "/react-example/"
LONG_REPLY = "Counting slowly: one, two, three, four, five, six, seven, eight, nine, ten."
SECOND_REPLY = "And back down: ten, nine, eight, seven, six, five, four, three, two, one."

RECORD_TEXTS = record_texts(".message.ai .text")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example bundled: a directory with index.html and app.js."""
    node = sdk_node(WHAT)
    out = tmp_path_factory.mktemp("react-example")
    built = subprocess.run(
        [node.node, "build-react.mjs", out],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, f"{built.stdout}\n{built.stderr}"
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
    """A fresh tab at the API origin's /react-example/ with the bundle."""
    with bundle_tab(browser, bundle, served.api.url, PAGE_PATH, RECORD_TEXTS) as tab:
        yield tab


GREETING = "Hello! Ask me anything."


def open_example(page: Page, served: Stack, name: str, script: list[dict[str, Any]]) -> None:
    """The page on a thread that has had its first exchange (the script's first turn): the
    page reads it from the thread's state as it opens."""
    assistant_id, thread_id = scripted_thread(
        served, name, [{"text": GREETING}, *script], "Hi there."
    )
    query = urlencode({"assistant": assistant_id, "thread": thread_id, "key": served.key})
    page.goto(f"{served.api.url}{PAGE_PATH}?{query}")
    expect(page.locator(".message.human .text")).to_have_text(["Hi there."])
    expect(page.locator(".message.ai .text")).to_have_text([GREETING])


def send(page: Page, text: str) -> None:
    page.locator("main > form input").fill(text)
    page.locator("main > form button[type=submit]").click()


def shown_texts(page: Page) -> list[str]:
    texts: list[str] = page.evaluate("window.__texts")
    return texts


def assert_grew(page: Page, reply: str) -> None:
    """The page showed `reply` after showing at least two shorter beginnings of it."""
    partial = [t for t in shown_texts(page) if reply.startswith(t) and t != reply]
    assert len(partial) >= 2, shown_texts(page)


def ai_texts(page: Page) -> list[str]:
    return page.locator(".message.ai .text").all_text_contents()


def test_a_streamed_reply_a_tool_call_and_a_question_answered_with_a_click(
    page: Page, served: Stack
) -> None:
    script: list[dict[str, Any]] = [
        {
            "text": "Let me look that up.",
            "chunks": 5,
            "delayMs": 1500,
            "toolCalls": [{"name": "put_note", "arguments": {"key": "city", "text": "unknown"}}],
        },
        {
            "toolCalls": [
                {
                    "name": "ask_user",
                    "arguments": {"question": "Which city?", "options": ["Paris", "Oslo"]},
                }
            ]
        },
        {"text": "Oslo it is: sunny, 21 degrees.", "chunks": 6, "delayMs": 1500},
    ]
    open_example(page, served, "weather", script)
    send(page, "What is the weather?")
    expect(page.locator(".message.human .text").last).to_have_text("What is the weather?")

    card = page.locator(".tool-call[data-tool=put_note]")
    expect(card).to_contain_text('{"key":"city","text":"unknown"}')
    expect(card.locator(".state")).to_have_text("completed")
    expect(page.locator(".message.ai .text").nth(1)).to_have_text("Let me look that up.")
    assert_grew(page, "Let me look that up.")

    question = page.locator(".question")
    expect(question).to_contain_text("Which city?")
    expect(page.locator(".busy")).to_be_hidden()
    question.get_by_role("button", name="Oslo").click()
    expect(question).to_be_hidden()
    expect(page.locator(".message.ai .text").last).to_have_text("Oslo it is: sunny, 21 degrees.")
    assert_grew(page, "Oslo it is: sunny, 21 degrees.")
    expect(page.locator(".busy")).to_be_hidden()
    expect(page.locator(".error")).to_have_count(0)


def test_the_page_carries_on_after_the_api_server_restarts(page: Page, served: Stack) -> None:
    script = [
        {"text": LONG_REPLY, "chunks": 20, "delayMs": 8000},
        {"text": SECOND_REPLY, "chunks": 20, "delayMs": 8000},
    ]
    open_example(page, served, "counter", script)

    # The page stays open: the SDK reconnects from the last event it saw.
    send(page, "Count to ten, slowly.")
    first = page.locator(".message.ai .text").nth(1)
    expect(first).to_contain_text("one,")
    served.restart_api()
    expect(first).to_have_text(LONG_REPLY, timeout=RECONNECT_MS)
    expect(page.locator(".busy")).to_be_hidden()
    assert ai_texts(page) == [GREETING, LONG_REPLY]
    assert_grew(page, LONG_REPLY)
    # No chunk shown twice: every text the reply showed was a beginning of it.
    counting = [t for t in shown_texts(page) if t.startswith("Counting")]
    assert all(LONG_REPLY.startswith(t) for t in counting), counting

    # The page reloads after the restart: reconnectOnMount joins the run's stream again.
    assert "thread=" in page.url
    send(page, "Now count back down.")
    second = page.locator(".message.ai .text").nth(2)
    expect(second).to_contain_text("nine,")
    served.restart_api()
    page.reload()
    expect(second).to_have_text(SECOND_REPLY, timeout=RECONNECT_MS)
    expect(page.locator(".busy")).to_be_hidden()
    assert ai_texts(page) == [GREETING, LONG_REPLY, SECOND_REPLY]
    humans = page.locator(".message.human .text").all_text_contents()
    assert humans == ["Hi there.", "Count to ten, slowly.", "Now count back down."]
    state = httpx.get(
        f"{served.protocol_url}/threads/{thread_of(page)}/state",
        headers={"x-api-key": served.key},
    ).json()
    assert [m["type"] for m in state["values"]["messages"]] == ["human", "ai"] * 3


def thread_of(page: Page) -> str:
    found = re.search(r"[?&]thread=([^&]+)", page.url)
    assert found, page.url
    return found[1]
