"""The workbench's assistants in a real browser (Debian's Chromium through Playwright, as in
tests/test_workbench.py, whose browser, page and server fixtures these tests share): the list,
one assistant with its versions, create (a 422 at its field), edit (a new version), delete, and
a session started from an assistant's older version, which says which assistant and version it
keeps, also once the assistant is deleted."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import ServerProcess
from tests.test_workbench import browser, page, web  # noqa: F401 (the shared fixtures)

pytestmark = pytest.mark.once

# The test extra installs it; without it `browser` skips (or fails under CI=true).
with contextlib.suppress(ImportError):
    from playwright.sync_api import Page, expect


@pytest.fixture
def http(web: ServerProcess) -> Iterator[httpx.Client]:  # noqa: F811
    with httpx.Client(base_url=web.url, timeout=30) as client:
        yield client


def fill_assistant(tab: Page, **fields: str) -> None:
    form = tab.locator("#assistant-form")
    for name, value in fields.items():
        form.locator(f"[name={name}]").fill(value)


def test_assistants_create_edit_version_start_and_delete(
    page: Page,  # noqa: F811
    web: ServerProcess,  # noqa: F811
    http: httpx.Client,
) -> None:
    page.goto(web.url)
    page.click("#assistants-button")
    expect(page.locator("#assistants-dialog")).to_be_visible()

    # Create: an unknown tool is named at its field; fixed, the assistant is version 1.
    page.click("#assistant-new")
    fill_assistant(page, name="Support bot", model="scripted", instructions="Be brief.")
    fill_assistant(page, tools="get_nte", approvalRequired="put_note")
    page.click("#assistant-form-submit")
    error = page.locator("#assistant-form .field-error")
    expect(error).to_contain_text("tools")
    expect(error).to_contain_text("get_note")  # the closest name
    expect(page.locator("#assistant-form [name=tools]")).to_have_attribute("aria-invalid", "true")
    fill_assistant(page, tools="get_note, put_note", metadata='{"team": "support"}')
    page.click("#assistant-form-submit")
    expect(page.locator("#assistant-edit-dialog")).to_be_hidden()
    expect(page.locator("#assistant-name")).to_have_text("Support bot")
    expect(page.locator("#assistant-version")).to_have_text("version 1")
    expect(page.locator("#assistant-list li")).to_have_count(1)
    expect(page.locator("#assistant-detail")).not_to_contain_text("null")  # no description
    (listed,) = http.get("/api/assistants").json()["assistants"]
    assert listed["tools"] == ["get_note", "put_note"]
    assert listed["approvalRequired"] == ["put_note"]
    assert listed["metadata"] == {"team": "support"}
    assistant_id = listed["id"]

    # Edit: a new version; the old one stays in the list of versions.
    page.click("#assistant-edit")
    expect(page.locator("#assistant-form-submit")).to_have_text("Save as a new version")
    fill_assistant(page, instructions="Be very brief.", approvalRequired="")
    page.click("#assistant-form-submit")
    expect(page.locator("#assistant-version")).to_have_text("version 2")
    expect(page.locator("#assistant-versions li")).to_have_count(2)
    expect(page.locator("#assistant-versions li").first).to_contain_text("v2")
    latest = http.get(f"/api/assistants/{assistant_id}").json()
    assert latest["version"] == 2 and latest["instructions"] == "Be very brief."
    assert not latest.get("approvalRequired")
    assert latest["tools"] == ["get_note", "put_note"]  # untouched fields stay

    # A session from its first version: the form starts from the assistant.
    page.click("#assistant-start")
    expect(page.locator("#create-dialog")).to_be_visible()
    expect(page.locator("#create-assistant")).to_have_value(assistant_id)
    expect(page.locator("#create-assistant-hint")).to_be_visible()
    page.locator("#create-assistant-version").select_option("1")
    page.fill("#create-form [name=prompt]", "hello from v1")
    page.click("#create-submit")
    expect(page.locator("#session")).to_be_visible()
    expect(page.locator("#session-assistant")).to_have_text("Support bot · v1")
    session_id = page.evaluate("location.hash.slice(1)")
    session: dict[str, Any] = http.get(f"/api/agent/{session_id}").json()
    assert session["assistant"]["id"] == assistant_id and session["assistant"]["version"] == 1
    assert session["instructions"] == "Be brief."

    # The label opens the assistant; delete it (asked once), and the session still says which.
    page.click("#session-assistant")
    expect(page.locator("#assistant-name")).to_have_text("Support bot")
    page.click("#assistant-delete")
    expect(page.locator("#assistant-delete")).to_have_text("Delete for good?")
    page.click("#assistant-delete")
    expect(page.locator("#assistant-list li")).to_have_count(0)
    expect(page.locator("#assistant-empty")).to_be_visible()
    assert http.get(f"/api/assistants/{assistant_id}").status_code == 404
    page.click("#assistants-close")
    page.reload()
    expect(page.locator("#session-assistant")).to_contain_text("deleted assistant")
    expect(page.locator("#session-assistant")).to_contain_text("v1")


def test_the_create_form_offers_no_assistant_by_default(
    page: Page,  # noqa: F811
    web: ServerProcess,  # noqa: F811
    http: httpx.Client,
) -> None:
    made = http.post("/api/assistants", json={"name": "Picker test", "model": "scripted"})
    assert made.status_code == 201, made.text
    page.goto(web.url)
    page.click("#new-session")
    picker = page.locator("#create-assistant")
    expect(picker.locator("option", has_text="Picker test (v1)")).to_have_count(1)
    expect(picker).to_have_value("")
    expect(page.locator("#create-assistant-version")).to_be_disabled()
    picker.select_option(made.json()["id"])
    expect(page.locator("#create-assistant-version")).to_be_enabled()
    expect(page.locator("#create-assistant-version option")).to_have_count(2)  # latest, v1


def test_the_assistants_fit_a_narrow_screen(
    page: Page,  # noqa: F811
    web: ServerProcess,  # noqa: F811
    http: httpx.Client,
) -> None:
    made = http.post("/api/assistants", json={"name": "On a phone", "model": "scripted"})
    assert made.status_code == 201, made.text
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(web.url)
    page.click("#assistants-button")
    page.locator("#assistant-list li", has_text="On a phone").click()
    expect(page.locator("#assistant-name")).to_have_text("On a phone")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    for part in ("#assistants-dialog", "#assistants-close", "#assistant-new", "#assistant-delete"):
        box = page.locator(part).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, (part, box)
