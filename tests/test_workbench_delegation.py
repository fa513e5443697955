"""Agents that delegate in the workbench (docs/delegation.md, docs/workbench.md) in a real
browser (Debian's Chromium through Playwright, sharing tests/test_workbench.py's browser,
page, server and worker fixtures): a delegate call's tool card nests its child session (a
link, its status live, then its answer); the link opens the child, whose header links back
to its parent; the session list shows the child under its parent; a child that asks a
question shows as waiting on the parent's card until it is answered.

The parent and the child are scripted: the child runs its assistant's `script`."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
import pytest

from tests.test_workbench import (  # noqa: F401 (the shared fixtures)
    browser,
    card,
    create,
    open_session,
    page,
    snap,
    wait_status,
    web,
    workers,
)
from tests.test_workbench_long import Bench, bench, events_of, of_type  # noqa: F401

pytestmark = pytest.mark.once

with contextlib.suppress(ImportError):
    from playwright.sync_api import expect


def assistant(http: httpx.Client, name: str, script: list[dict[str, Any]]) -> str:
    response = http.post(
        "/api/assistants", json={"name": name, "model": "scripted", "script": script}
    )
    assert response.status_code == 201, response.text
    aid: str = response.json()["id"]
    return aid


def delegating(http: httpx.Client, title: str, tool: str, task: str, delegate: str) -> str:
    """A parent whose first turn hands `task` to `delegate`, then answers."""
    script = [
        {"toolCalls": [{"name": tool, "arguments": {"task": task}}]},
        {"text": "Plan done."},
    ]
    return str(create(http, "Plan a trip", title=title, script=script, delegates=[delegate])["id"])


def test_a_delegate_card_nests_its_child_and_links_both_ways(bench: Bench) -> None:  # noqa: F811
    tab, http = bench.page, bench.http
    slow = [
        {"toolCalls": [{"name": "sleep", "arguments": {"seconds": 2}}]},
        {"text": "Lyon: 3 days"},
    ]
    researcher = assistant(http, "Researcher", slow)
    parent = delegating(http, "Trip plan", "agent__researcher", "look up Lyon", researcher)
    open_session(tab, bench.url, parent)
    delegate = card(tab, "agent__researcher")
    box = delegate.locator(".delegate")
    # While the child works, the call runs and the card says the child's status, live.
    expect(delegate).to_have_attribute("data-status", "running")
    expect(box.locator(".delegate-status")).to_have_text("running")
    expect(tab.locator("#chat .marker-info")).to_have_text("Waiting for its delegated sessions")
    snap(tab, "delegation")
    made = of_type(events_of(http, parent), "delegate_call")[0]["data"]
    child = made["childSessionId"]
    link = box.locator("a.delegate-link")
    expect(link).to_have_attribute("href", f"#{child}")
    # The child's end: its answer on the card, and the parent goes on with it.
    expect(box.locator(".delegate-answer")).to_have_text("Lyon: 3 days")
    expect(box.locator(".delegate-status")).to_have_text("succeeded")
    expect(delegate).to_have_attribute("data-status", "succeeded")
    expect(tab.locator("#status")).to_have_text("succeeded")
    expect(tab.locator("#chat .msg.assistant .bubble").last).to_have_text("Plan done.")
    title = http.get(f"/api/agent/{child}").json()["title"]
    expect(link).to_have_text(title)
    # The list shows the child right under its parent, tagged.
    rows = tab.locator("#sessions li")
    expect(tab.locator(f"#sessions li.child[data-id='{child}'] .tag.delegated")).to_be_visible()
    ids = rows.evaluate_all("l => l.map(e => e.dataset.id)")
    assert ids.index(child) == ids.index(parent) + 1, ids
    expect(tab.locator(f"#sessions li[data-id='{parent}']")).not_to_have_class("child")
    # The link opens the child, whose header links back to the parent.
    link.click()
    expect(tab).to_have_url(f"{bench.url}/#{child}")
    expect(tab.locator("#title")).to_have_text(title)
    back = tab.locator("#delegated-by-link")
    expect(back).to_have_text(f"delegated by Trip plan (call …{made['toolCallId'][-8:]})")
    expect(tab.locator("#chat .msg.user .bubble")).to_have_text("look up Lyon")
    expect(tab.locator("#chat .msg.assistant .bubble")).to_have_text("Lyon: 3 days")
    back.click()
    expect(tab).to_have_url(f"{bench.url}/#{parent}")
    expect(tab.locator("#title")).to_have_text("Trip plan")
    expect(tab.locator("#delegated-by")).to_be_hidden()


def test_a_child_that_asks_shows_waiting_on_the_parent(bench: Bench) -> None:  # noqa: F811
    tab, http = bench.page, bench.http
    ask = {
        "name": "ask_user",
        "arguments": {"question": "Which month?", "options": ["May", "June"]},
    }
    asker = assistant(http, "Asker", [{"toolCalls": [ask]}, {"text": "In May."}])
    parent = delegating(http, "Ask plan", "agent__asker", "pick a month", asker)
    open_session(tab, bench.url, parent)
    box = card(tab, "agent__asker").locator(".delegate")
    expect(box.locator(".delegate-status")).to_have_text("waiting")
    expect(box.locator(".delegate-waiting")).to_be_visible()
    expect(tab.locator("#status")).to_have_text("waiting")
    # Answered in the child itself; the parent's card follows.
    box.locator("a.delegate-link").click()
    expect(tab.locator("#delegated-by-link")).to_contain_text("delegated by Ask plan")
    tab.locator("#chat .question .option", has_text="May").click()
    expect(tab.locator("#status")).to_have_text("succeeded")
    tab.locator("#delegated-by-link").click()
    expect(tab.locator("#title")).to_have_text("Ask plan")
    expect(box.locator(".delegate-answer")).to_have_text("In May.")
    expect(box.locator(".delegate-waiting")).to_have_count(0)
    expect(tab.locator("#status")).to_have_text("succeeded")
    wait_status(http, parent, {"succeeded"})
