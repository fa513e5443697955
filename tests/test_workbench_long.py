"""Long sessions in the workbench (SPEC section 11, docs/workbench.md) in a real browser
(Debian's Chromium through Playwright, sharing tests/test_workbench.py's browser, page, server
and worker fixtures): a scripted compaction shows as a marker with its summary folded and every
earlier event still shown; Compact asks for one; "Edit" on a user message forks with the new
text and opens the fork, whose answer differs and which links back to its parent; "Retry from
here" on an agent message forks at the user message it answered, which the fork answers again.

The scripted model answers "You said: <the last user message>" past its script, so an edit
shows in the answer; a script turn's `summary` is what a compaction covering it writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess
from tests.test_compaction import note_turns
from tests.test_workbench import (  # noqa: F401 (the shared fixtures)
    Workers,
    assert_log_matches,
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

pytestmark = pytest.mark.once

# The test extra installs it; without it `browser` skips (or fails under CI=true).
with contextlib.suppress(ImportError):
    from playwright.sync_api import Page, expect

DONE = {"succeeded"}


@dataclass
class Bench:
    """A tab on the workbench, with workers running and the API at hand."""

    page: Page
    url: str
    http: httpx.Client


@pytest.fixture
def bench(page: Page, web: ServerProcess, workers: Workers) -> Iterator[Bench]:  # noqa: F811
    with httpx.Client(base_url=web.url, timeout=30) as http:
        yield Bench(page, web.url, http)


def events_of(http: httpx.Client, sid: str) -> list[dict[str, Any]]:
    body = http.get(f"/api/agent/{sid}/transcript", params={"limit": 1000}).json()
    events: list[dict[str, Any]] = body["events"]
    return events


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def test_a_compaction_shows_as_a_marker_with_its_summary_folded(bench: Bench) -> None:
    tab, http = bench.page, bench.http
    compaction = {"triggerTokens": 600, "keepRecentTurns": 1}
    script = [*note_turns(6), {"text": "all saved"}]
    sid = create(http, "save six notes", title="Long notes", script=script, compaction=compaction)
    sid = sid["id"]
    open_session(tab, bench.url, sid)
    expect(tab.locator("#status")).to_have_text("succeeded")
    expect(tab.locator("#details")).to_contain_text(
        "Compactionpast 600 tokens · keeps the last 1 turn"
    )
    compacted = of_type(events_of(http, sid), "session_compacted")
    assert compacted, "the script did not compact"
    markers = tab.locator("#chat details.compaction")
    expect(markers).to_have_count(len(compacted))
    for marker, event in zip(markers.all(), compacted, strict=True):
        data = event["data"]
        expect(marker).to_have_attribute("data-seq", str(event["seq"]))
        expect(marker.locator(".compaction-text")).to_have_text(
            f"Compacted: the model sees a summary of #1\u2013#{data['throughSeq']}"
        )
        expect(marker.locator(".compaction-detail")).to_have_text(
            f"{data['tokensBefore']} → {data['tokensAfter']} tokens · scripted"
        )
        # Folded: the summary shows on a click.
        summary = marker.locator(".compaction-summary")
        expect(summary).to_be_hidden()
        marker.locator("summary").click()
        expect(summary).to_have_text(data["summary"])
    # Nothing is hidden by a compaction: every turn, every tool card, in the log's order.
    bubbles = tab.locator("#chat .msg.assistant .bubble")
    expect(bubbles).to_have_text([*(f"turn {i}" for i in range(6)), "all saved"])
    expect(tab.locator("#chat article.tool[data-status=succeeded]")).to_have_count(6)
    first = compacted[0]
    order = tab.locator("#chat > [data-seq]").evaluate_all(
        "l => l.map(e => Number(e.dataset.seq)).filter(Boolean)"
    )
    assert order == sorted(order) and first["seq"] in order
    assert any(seq <= first["data"]["throughSeq"] for seq in order)
    snap(tab, "compaction")
    tab.click("#tab-events")
    assert_log_matches(tab, http, sid)


def test_compact_asks_for_a_compaction_of_a_finished_session(bench: Bench) -> None:
    tab, http = bench.page, bench.http
    sid = create(http, "save two", title="Compact me", script=[*note_turns(2), {"text": "saved"}])
    sid = sid["id"]
    open_session(tab, bench.url, sid)
    expect(tab.locator("#status")).to_have_text("succeeded")
    expect(tab.locator("#chat details.compaction")).to_have_count(0)
    tab.click("#compact")
    expect(tab.locator("#chat .marker", has_text="Compaction requested")).to_have_count(1)
    marker = tab.locator("#chat details.compaction")
    expect(marker).to_have_count(1)
    marker.locator("summary").click()
    # keepRecentTurns defaults to 2: the first turn is summarized.
    expect(marker.locator(".compaction-summary")).to_have_text("notes k0..k0 are saved")
    expect(tab.locator("#status")).to_have_text("succeeded")
    expect(tab.locator("#chat .msg.assistant .bubble")).to_have_text(["turn 0", "turn 1", "saved"])
    # A session with nothing to compact is not offered it.
    idle = http.post("/api/agent", json={"title": "Nothing to compact"}).json()["id"]
    open_session(tab, bench.url, idle)
    expect(tab.locator("#status")).to_have_text("idle")
    expect(tab.locator("#compact")).to_be_hidden()


def test_edit_a_user_message_forks_and_opens_the_fork(bench: Bench) -> None:
    tab, http = bench.page, bench.http
    parent = create(http, "first", title="Edit me")["id"]
    wait_status(http, parent, DONE)
    posted = http.post(f"/api/agent/{parent}/messages", json={"text": "second"})
    assert posted.status_code == 202, posted.text
    at = posted.json()["message"]["seq"]
    open_session(tab, bench.url, parent)
    answers = tab.locator("#chat .msg.assistant .bubble")
    expect(answers).to_have_text(["You said: first", "You said: second"])
    expect(tab.locator("#status")).to_have_text("succeeded")
    before = events_of(http, parent)

    # Edit opens the message in place; Cancel leaves it as it was.
    message = tab.locator(f"#chat .msg.user[data-seq='{at}']")
    message.locator("button.edit").click()
    editor = tab.locator(f"#chat form.editing[data-seq='{at}']")
    expect(editor.locator("textarea")).to_have_value("second")
    editor.locator("button", has_text="Cancel").click()
    expect(editor).to_have_count(0)
    expect(message.locator(".bubble")).to_have_text("second")

    message.locator("button.edit").click()
    editor.locator("textarea").fill("edited")
    snap(tab, "edit")
    editor.locator("button[type=submit]").click()
    # The page opens the fork, which answers the edited message.
    expect(tab).not_to_have_url(f"{bench.url}/#{parent}")
    fork = tab.evaluate("location.hash.slice(1)")
    assert fork and fork != parent
    expect(answers).to_have_text(["You said: first", "You said: edited"])
    expect(tab.locator("#status")).to_have_text("succeeded")
    link = tab.locator("#forked-from-link")
    expect(link).to_have_text(f"forked from Edit me at #{at}")
    # In the conversation, where the copied history ends: right after the edited message.
    point = tab.locator("#chat .marker", has_text="Forked from")
    expect(point).to_have_text(f"Forked from Edit me at #{at}: what follows is this session's own")
    assert point.evaluate("m => m.previousElementSibling.dataset.seq") == str(at)
    expect(point.locator("xpath=preceding-sibling::*[1]")).to_have_class("msg user")
    expect(tab.locator(f"#sessions li[data-id='{fork}'] .tag.fork")).to_be_visible()
    shown = http.get(f"/api/agent/{fork}").json()
    assert shown["forkedFrom"] == {"sessionId": parent, "seq": at}
    texts = [e["data"]["text"] for e in of_type(events_of(http, fork), "assistant_message")]
    assert texts == ["You said: first", "You said: edited"]
    snap(tab, "fork")
    # The parent is untouched, and the link leads back to it.
    assert events_of(http, parent) == before
    link.click()
    expect(tab).to_have_url(f"{bench.url}/#{parent}")
    expect(tab.locator("#title")).to_have_text("Edit me")
    expect(tab.locator("#forked-from")).to_be_hidden()
    expect(tab.locator("#chat .marker", has_text="Forked from")).to_have_count(0)
    expect(answers).to_have_text(["You said: first", "You said: second"])


def test_retry_from_here_forks_at_the_message_it_answered(bench: Bench) -> None:
    tab, http = bench.page, bench.http
    note = {"name": "put_note", "arguments": {"key": "k", "text": "v"}}
    script = [{"text": "Noting.", "toolCalls": [note]}, {"text": "Noted."}]
    parent = create(http, "note it", title="Retry me", script=script)["id"]
    wait_status(http, parent, DONE)
    posted = http.post(f"/api/agent/{parent}/messages", json={"text": "and again"})
    at = posted.json()["message"]["seq"]
    wait_status(http, parent, DONE)
    open_session(tab, bench.url, parent)
    answers = tab.locator("#chat .msg.assistant")
    expect(answers.locator(".bubble")).to_have_text(["Noting.", "Noted.", "You said: and again"])
    # Retry on the last answer: the fork is the log through "and again", answered anew.
    answers.last.locator("button.retry").click()
    expect(tab).not_to_have_url(f"{bench.url}/#{parent}")
    fork = tab.evaluate("location.hash.slice(1)")
    expect(tab.locator("#forked-from-link")).to_have_text(f"forked from Retry me at #{at}")
    expect(tab.locator("#status")).to_have_text("succeeded")
    expect(answers.locator(".bubble")).to_have_text(["Noting.", "Noted.", "You said: and again"])
    events = events_of(http, fork)
    assert http.get(f"/api/agent/{fork}").json()["forkedFrom"] == {"sessionId": parent, "seq": at}
    # The answer is the fork's own (a run of it: attempt 1), the history before it copied.
    (answer,) = [e for e in of_type(events, "assistant_message") if e["seq"] > at]
    assert answer["attempt"] == 1 and answer["data"]["text"] == "You said: and again"
    assert {e["attempt"] for e in events if e["seq"] <= at} == {0}
    # Retry on the first turn's answer forks at the prompt: the script plays again.
    tab.click(f"#sessions li[data-id='{parent}'] button")
    expect(tab.locator("#title")).to_have_text("Retry me")
    answers.first.locator("button.retry").click()
    expect(tab.locator("#forked-from-link")).to_have_text("forked from Retry me at #1")
    expect(tab.locator("#status")).to_have_text("succeeded")
    expect(answers.locator(".bubble")).to_have_text(["Noting.", "Noted."])
    expect(card(tab, "put_note")).to_have_attribute("data-status", "succeeded")
