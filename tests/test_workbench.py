"""The workbench at `/` in a real browser: Playwright for Python driving Debian's Chromium.

One browser for the module; real `ferryman serve` and `ferryman worker` processes on a database
of the module's own; sessions scripted with the scripted model so they end in seconds. Covered:
a session created from the form and watched to its end, errors that name their field, tool
cards through their states, a worker SIGKILLed mid-tool (the resumed marker, the interrupted
card), a provider retry, cancel, an approval, a question, paging past 200 sessions with search
and filter, keys mode with and without a key, and the API server restarted under an open page.

Chromium is `/usr/bin/chromium` (`apt-get install chromium`; `.ci/run` installs it). Without it
the module skips locally and fails in CI (`CI=true`). With `FERRYMAN_SCREENSHOTS=1` the tests
also write the README's screenshots to docs/screenshots/.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import (
    REPO,
    WORKER_ENV,
    ServerProcess,
    WorkerProcess,
    create_owner_key,
    fresh_database,
    missing,
    stop_all,
)

pytestmark = pytest.mark.once

CHROMIUM = os.environ.get("FERRYMAN_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(REPO) / "docs" / "screenshots"
WAIT_MS = 20_000
TERMINAL = {"succeeded", "failed", "cancelled"}

try:
    from playwright.sync_api import Browser, Page, expect, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # pragma: no cover - the test extra installs it
    sync_playwright = None


def _unavailable(reason: str) -> None:
    missing(reason, "the workbench's tests in a real browser")


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if sync_playwright is None:
        _unavailable("playwright is not installed: pip install -e '.[test]'")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def web(isolated_db: str) -> Iterator[ServerProcess]:
    """The API server the page talks to (local mode, no worker): a test restarts it."""
    server = ServerProcess(isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"}).start()
    yield server
    server.stop()


class Workers:
    """Worker processes on the module's database; a killed one is replaced."""

    def __init__(self, url: str) -> None:
        self.url = url
        # Provider retries on (conftest turns them off for every process): one test retries.
        self.env = {**WORKER_ENV, "FERRYMAN_MODEL_MAX_RETRIES": "3"}
        self.alive: list[WorkerProcess] = []

    def spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self.url, env=self.env, concurrency=4).start()
        self.alive.append(worker)
        return worker

    def kill(self, pid: int) -> None:
        (worker,) = [w for w in self.alive if w.pid == pid]
        worker.signal(signal.SIGKILL)
        assert worker.proc is not None
        worker.proc.wait(10)
        self.alive.remove(worker)


def wait_ready(worker: WorkerProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while "started (concurrency" not in worker.logs():
        assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
        assert time.monotonic() < deadline, f"worker not ready:\n{worker.logs()}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def workers(isolated_db: str) -> Iterator[Workers]:
    pool = Workers(isolated_db)
    for worker in [pool.spawn(), pool.spawn()]:
        wait_ready(worker)
    yield pool
    stop_all(pool.alive)


@pytest.fixture(scope="module")
def quiet_db() -> Iterator[str]:
    """A database no worker claims from: sessions made there stay queued."""
    with fresh_database("ferryman_web") as url:
        yield url


@pytest.fixture(scope="module")
def keys_server(quiet_db: str) -> Iterator[ServerProcess]:
    server = ServerProcess(quiet_db, env={"FERRYMAN_AUTH": "keys"}).start()
    yield server
    server.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab (its own sessionStorage); the test fails on any script error in it."""
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert errors == [], errors


@pytest.fixture
def http(web: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=web.url, timeout=30) as client:
        yield client


# --- helpers ---------------------------------------------------------------------------------


def snap(page: Page, name: str) -> None:
    """The README's screenshots, taken only when asked for (FERRYMAN_SCREENSHOTS=1)."""
    if os.environ.get("FERRYMAN_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def in_page(name: str) -> str:
    """A function for `page.evaluate` from tests/<name>, without its leading comment lines."""
    lines = (Path(__file__).parent / name).read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith("//"))


def create(http: httpx.Client, prompt: str, **body: Any) -> dict[str, Any]:
    response = http.post("/api/agent", json={"prompt": prompt, **body})
    assert response.status_code == 201, response.text
    session: dict[str, Any] = response.json()
    return session


def wait_until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def session_of(http: httpx.Client, sid: str) -> dict[str, Any]:
    body: dict[str, Any] = http.get(f"/api/agent/{sid}").json()
    return body


def wait_status(http: httpx.Client, sid: str, statuses: set[str]) -> dict[str, Any]:
    found: dict[str, Any] = wait_until(
        lambda: (s := session_of(http, sid))["status"] in statuses and s, f"{sid} in {statuses}"
    )
    return found


def open_session(page: Page, base: str, sid: str) -> None:
    page.goto(f"{base}/#{sid}")
    expect(page.locator("#session")).to_be_visible()


def card(page: Page, name: str, nth: int = 0) -> Any:
    return page.locator(f"#chat article.tool:has(.tool-name:text-is('{name}'))").nth(nth)


def shown_seqs(page: Page) -> list[int]:
    return [
        int(s) for s in page.locator("#events li").evaluate_all("l => l.map(e => e.dataset.seq)")
    ]


def assert_log_matches(page: Page, http: httpx.Client, sid: str) -> None:
    """The page's raw log holds every durable event of the session once, in order."""
    last = session_of(http, sid)["lastSeq"]
    wait_until(lambda: shown_seqs(page)[-1:] == [last], f"the page at seq {last}")
    assert shown_seqs(page) == list(range(1, last + 1))
    types = page.locator("#events li").evaluate_all("l => l.map(e => e.dataset.type)")
    events = http.get(f"/api/agent/{sid}/transcript", params={"limit": 1000}).json()["events"]
    assert types == [e["type"] for e in events]


# --- the tests -------------------------------------------------------------------------------


def test_assets_load_and_the_fold_behaves_in_the_browser(page: Page, web: ServerProcess) -> None:
    """The pure fold (conversation.js over the bundled SessionFold: the bundle loads as a plain
    ES module) fed synthetic logs in the page's own engine: timeouts,
    retries that drop partial text, a resume that marks exactly the repaired calls, stale and
    replayed frames."""
    page.goto(web.url)
    expect(page.locator("#conn")).to_have_text("live")
    icon = page.request.get(f"{web.url}/favicon.ico")
    assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    result = page.evaluate(in_page("workbench_fold.js"))
    assert result["afterRetry"] == 0  # the retried turn's partial text is gone
    assert result["draft"] == "Two calls"  # and the stale delta never joined the new draft
    assert result["replayed"] is False
    assert result["a"] == ["timed_out", None]
    assert result["b"] == ["interrupted", "crash"]
    assert result["label"] == "interrupted by a worker crash"
    assert result["c"] == ["pending", None]  # never started, never repaired: untouched
    assert result["draftAfterResume"] is None
    assert result["texts"] == ["Two calls"]
    assert result["markers"] == [
        "Started on w1 · attempt 1",
        "Provider busy, retrying in 1.5 s",
        "Worker died, resumed on w2 at attempt 2",
    ]
    assert result["followUp"] == ["quiet", "Continued on w3 · attempt 3"]


def test_create_errors_name_the_field(page: Page, web: ServerProcess) -> None:
    page.goto(web.url)
    page.click("#new-session")
    form = page.locator("#create-form")
    form.locator("[name=prompt]").fill("bad settings")
    form.locator("[name=script]").fill('[{"text": "unclosed"')
    page.click("#create-submit")
    expect(form.locator(".field-error")).to_contain_text("script: is not valid JSON")
    form.locator("[name=script]").fill('[{"text": "ok", "delayMs": -1}]')
    page.click("details.more-options:has-text('Model settings') summary")
    form.locator("[name=temperature]").fill("5")
    page.click("#create-submit")
    errors = form.locator(".field-error")
    expect(errors.filter(has_text="modelSettings.temperature")).to_be_visible()
    expect(errors.filter(has_text="script.0.delayMs")).to_be_visible()
    expect(form.locator("[name=temperature]")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#create-problem")).to_contain_text("modelSettings.temperature")
    snap(page, "new-session-errors")


def test_create_and_watch_a_session_to_its_end(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    page.goto(web.url)
    page.click("#new-session")
    form = page.locator("#create-form")
    form.locator("[name=prompt]").fill("Plan the release")
    form.locator("[name=title]").fill("Release plan")
    form.locator("[name=instructions]").fill("Be brief.")
    page.click("#script-example")
    page.click("details.more-options:has-text('Tools') summary")
    form.locator("[name=allTools]").uncheck()
    form.locator("input[name=tool][value=get_note]").uncheck()
    page.click("details.more-options:has-text('Model settings') summary")
    form.locator("[name=maxTokens]").fill("500")
    snap(page, "new-session")
    page.click("#create-submit")
    expect(page.locator("#create-dialog")).to_be_hidden()
    expect(page.locator("#title")).to_have_text("Release plan")
    sid = page.evaluate("location.hash.slice(1)")
    # The form's options reached the server.
    created = session_of(http, sid)
    assert created["instructions"] == "Be brief."
    assert created["modelSettings"] == {"maxTokens": 500}
    chat = page.locator("#chat")
    expect(chat.locator(".msg.user .bubble")).to_have_text("Plan the release")
    # The last turn streams in 12 chunks over 1.5 s: it grows in place, then settles.
    streaming = chat.locator(".msg.assistant.streaming")
    expect(streaming).to_be_visible()
    final = "Done: the note is saved and I have rested. Anything else?"
    expect(chat.locator(".msg.assistant:not(.streaming) .bubble").last).to_have_text(final)
    expect(streaming).to_have_count(0)
    expect(page.locator("#status")).to_have_text("succeeded")
    expect(page.locator(f"#sessions li[data-id='{sid}'] .badge")).to_have_text("succeeded")
    expect(chat.locator(".marker-ok")).to_have_text("Finished")
    expect(card(page, "put_note")).to_have_attribute("data-status", "succeeded")
    expect(card(page, "sleep")).to_have_attribute("data-status", "succeeded")
    assert chat.get_by_text(final).count() == 1
    # Buttons fit the state: no Cancel on a finished session; Send re-queues.
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#send")).to_have_text("Send & re-queue")
    details = page.locator("#details")
    expect(details).to_contain_text("Attempt1")
    expect(details).to_contain_text("Created")
    expect(details).to_contain_text("Updated")
    expect(details).to_contain_text("0 in · 0 out · 0 cached")
    # A tool result unfolds; the raw log is one click away, every event once.
    card(page, "put_note").locator("summary").click()
    expect(card(page, "put_note").locator("pre")).to_be_visible()
    page.click("#tab-events")
    expect(page.locator("#events")).to_be_visible()
    assert_log_matches(page, http, sid)
    snap(page, "events")
    page.click("#tab-chat")
    # Delete asks once: the first click arms, the second deletes.
    page.click("#delete")
    expect(page.locator("#delete")).to_have_text("Delete for good?")
    assert session_of(http, sid)["id"] == sid
    page.click("#delete")
    expect(page.locator("#welcome-notice")).to_have_text("Session deleted.")
    expect(page.locator(f"#sessions li[data-id='{sid}']")).to_have_count(0)
    assert http.get(f"/api/agent/{sid}").status_code == 404


def test_a_tool_card_through_its_states_and_a_steer(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    script = [
        {"text": "Napping.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 3}}]},
        {"text": "Oops.", "toolCalls": [{"name": "no_such_tool", "arguments": {"x": 1}}]},
        {"text": "Done."},
    ]
    page.goto(web.url)
    expect(page.locator("#conn")).to_have_text("live")
    sid = create(http, "tools", title="Tool states", script=script)["id"]
    page.click(f"#sessions li[data-id='{sid}'] button")
    sleep = card(page, "sleep")
    expect(sleep).to_have_attribute("data-status", "running")
    expect(sleep.locator(".tool-state")).to_have_text("running")
    expect(sleep.locator(".tool-args")).to_have_text('{"seconds":3}')
    # While it runs, Send steers and Cancel is offered.
    expect(page.locator("#send")).to_have_text("Steer")
    expect(page.locator("#cancel")).to_be_visible()
    snap(page, "tool-running")
    expect(sleep).to_have_attribute("data-status", "succeeded")
    expect(sleep.locator(".tool-state")).to_have_text("succeeded")
    failed = card(page, "no_such_tool")
    expect(failed).to_have_attribute("data-status", "failed")
    failed.locator("summary").click()
    expect(failed.locator("pre")).to_contain_text("unknown tool")
    expect(page.locator("#status")).to_have_text("succeeded")
    # A message re-queues the finished session; it answers again.
    expect(page.locator("#send")).to_have_text("Send & re-queue")
    page.fill("#text", "once more")
    page.click("#send")
    expect(page.locator("#chat .msg.user .bubble").last).to_have_text("once more")
    expect(page.locator("#chat .msg.assistant .bubble").last).to_have_text("You said: once more")
    assert_log_matches(page, http, sid)


def test_a_worker_killed_mid_tool_shows_the_resume(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    script = [
        {"text": "Napping.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 4}}]},
        {"text": "Woke up.", "chunks": 4, "delayMs": 400},
    ]
    sid = create(http, "crash", title="Crash mid-tool", script=script)["id"]
    open_session(page, web.url, sid)
    expect(card(page, "sleep")).to_have_attribute("data-status", "running")
    lease = wait_until(lambda: session_of(http, sid)["lease"], "a lease")
    expect(page.locator("#details")).to_contain_text(f"pid {lease['pid']}")
    workers.kill(lease["pid"])
    spare = workers.spawn()  # the survivor resumes it; this one keeps the pool at two
    marker = page.locator("#chat .marker-warn", has_text="Worker died, resumed on")
    expect(marker).to_contain_text("at attempt 2")
    expect(marker).to_contain_text("1 tool call interrupted")
    first = card(page, "sleep", 0)
    expect(first).to_have_attribute("data-status", "interrupted")
    expect(first.locator(".tool-state")).to_have_text("interrupted by a worker crash")
    # The model replays the turn: the new call runs, and only the repaired card is interrupted.
    expect(card(page, "sleep", 1)).to_have_attribute("data-status", re.compile("running|succeeded"))
    expect(page.locator("#chat article.tool[data-status=interrupted]")).to_have_count(1)
    expect(page.locator("#details")).to_contain_text("Attempt2")
    snap(page, "crash-resumed")
    expect(page.locator("#status")).to_have_text("succeeded")
    expect(page.locator("#chat .msg.assistant .bubble").last).to_have_text("Woke up.")
    expect(page.locator("#chat article.tool[data-status=interrupted]")).to_have_count(1)
    expect(page.locator(f"#sessions li[data-id='{sid}'] .resumes")).to_have_text("resumed once")
    assert_log_matches(page, http, sid)
    wait_ready(spare)


def test_a_provider_retry_replaces_the_partial_text(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    text = "A reply that the provider cut off once."
    fault = {"kind": "server_error", "retryAfterMs": 1000}
    script = [{"text": text, "chunks": 6, "delayMs": 900, "fault": fault}]
    sid = create(http, "retry", title="Provider retry", script=script)["id"]
    open_session(page, web.url, sid)
    expect(page.locator("#chat .marker-warn")).to_contain_text(
        re.compile(r"Provider busy, retrying in [0-9.]+ s")
    )
    expect(page.locator("#status")).to_have_text("succeeded")
    bubbles = page.locator("#chat .msg.assistant .bubble")
    expect(bubbles).to_have_count(1)
    expect(bubbles).to_have_text(text)
    assert_log_matches(page, http, sid)


def test_cancel_a_running_session(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    script = [{"text": "Long nap.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 60}}]}]
    sid = create(http, "cancel me", title="Cancel me", script=script)["id"]
    open_session(page, web.url, sid)
    expect(card(page, "sleep")).to_have_attribute("data-status", "running")
    expect(page.locator("#cancel")).to_be_enabled()
    page.click("#cancel")
    expect(page.locator("#status")).to_have_text("cancelled")
    expect(page.locator("#cancel")).to_be_hidden()
    expect(card(page, "sleep")).to_have_attribute("data-status", "cancelled")
    expect(page.locator("#problem")).to_be_hidden()  # no 409 from a second cancel
    expect(page.locator(f"#sessions li[data-id='{sid}'] .badge")).to_have_text("cancelled")


def test_an_approval_and_a_question(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    note = {"name": "put_note", "arguments": {"key": "deploy", "text": "friday"}}
    ask = {"question": "Which colour?", "options": ["Red", "Blue"]}
    script = [
        {"text": "I will save a note.", "toolCalls": [note]},
        {"text": "One question.", "toolCalls": [{"name": "ask_user", "arguments": ask}]},
        {"text": "Blue it is."},
    ]
    sid = create(http, "approve", title="Approval", script=script, approvalRequired=["put_note"])[
        "id"
    ]
    open_session(page, web.url, sid)
    pending = card(page, "put_note")
    expect(pending).to_have_attribute("data-status", "awaiting_approval")
    expect(page.locator("#status")).to_have_text("waiting")
    expect(page.locator("#chat .marker-info")).to_have_text("Waiting for your approval")
    snap(page, "approval")
    pending.get_by_role("button", name="Approve").click()
    expect(pending).to_have_attribute("data-status", "succeeded")
    question = page.locator("#chat .question")
    expect(question.locator(".question-text")).to_have_text("Which colour?")
    expect(page.locator("#status")).to_have_text("waiting")
    snap(page, "question")
    question.get_by_role("button", name="Blue").click()
    expect(page.locator("#chat .msg.user .bubble").last).to_have_text("Blue")
    expect(page.locator("#status")).to_have_text("succeeded")
    expect(page.locator("#chat .msg.assistant .bubble").last).to_have_text("Blue it is.")
    expect(question.locator(".option")).to_have_count(0)  # answered
    assert_log_matches(page, http, sid)


def test_a_message_to_a_session_waiting_for_approval_asks_first(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    """A message denies the calls that wait for approval: the composer says so, and asks in a
    dialog of the page before sending. Follow-ups are runs, not takeovers: no resume shown."""
    note = {"name": "put_note", "arguments": {"key": "k", "text": "t"}}
    script = [{"text": "Saving.", "toolCalls": [note]}, {"text": "Understood."}]
    sid = create(
        http, "deny", title="Deny by message", script=script, approvalRequired=["put_note"]
    )["id"]
    open_session(page, web.url, sid)
    expect(card(page, "put_note")).to_have_attribute("data-status", "awaiting_approval")
    expect(page.locator("#send")).to_have_text("Deny & send")
    expect(page.locator("#send-hint")).to_contain_text(
        "A message denies the call of put_note that waits for approval"
    )
    page.locator("#text").fill("Do not save it.")
    page.click("#send")
    dialog = page.locator("#deny-dialog")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("denies the call of put_note")
    page.click("#deny-keep")  # not sent: the call still waits
    expect(dialog).to_be_hidden()
    page.wait_for_timeout(300)
    assert session_of(http, sid)["status"] == "waiting"
    expect(page.locator("#text")).to_have_value("Do not save it.")
    page.click("#send")
    page.click("#deny-send")
    expect(card(page, "put_note")).to_have_attribute("data-status", "denied")
    expect(page.locator("#status")).to_have_text("succeeded")
    expect(page.locator("#chat .msg.assistant .bubble").last).to_have_text("Understood.")
    expect(page.locator("#chat .marker", has_text="resumed")).to_have_count(0)
    expect(page.locator("#chat .marker", has_text="Continued on")).to_have_count(1)
    done = session_of(http, sid)
    assert (done["attempt"], done["resumes"]) == (2, 0)
    expect(page.locator(f"#sessions li[data-id='{sid}'] .resumes")).to_have_count(0)


def test_the_tool_list_marks_tools_only_some_workers_have(
    page: Page, web: ServerProcess, workers: Workers, tmp_path: Path
) -> None:
    config = tmp_path / "mcp.json"
    notes = {
        "name": "notes",
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "tests.mcp_servers.notes_server"],
        "cwd": REPO,
        "env": {"NOTES_SERVER_LOG": str(tmp_path / "notes.jsonl")},
    }
    config.write_text(json.dumps({"servers": [notes]}))
    with_mcp = WorkerProcess(
        workers.url, env={**workers.env, "FERRYMAN_MCP_SERVERS": str(config)}
    ).start()
    try:
        wait_ready(with_mcp)
        page.goto(web.url)
        page.click("#new-session")
        page.click("details.more-options:has-text('Tools') summary")
        total = len(workers.alive) + 1
        expect(page.locator(".tool-option[data-tool=notes__echo] .partial")).to_have_text(
            f"1 of {total} workers"
        )
        expect(page.locator(".tool-option[data-tool=put_note] .partial")).to_have_count(0)
    finally:
        with_mcp.stop()
    # Stopped: its tools leave the list the next time the form opens.
    page.click("#create-cancel")
    page.click("#new-session")
    expect(page.locator(".tool-option[data-tool=put_note]")).to_be_visible()
    expect(page.locator(".tool-option[data-tool=notes__echo]")).to_have_count(0)


def test_keys_mode_asks_for_a_key(page: Page, keys_server: ServerProcess, quiet_db: str) -> None:
    _, key = create_owner_key(quiet_db)
    with httpx.Client(base_url=keys_server.url, headers={"Authorization": f"Bearer {key}"}) as h:
        assert h.post("/api/agent", json={"prompt": "x", "title": "Keyed"}).status_code == 201
    page.goto(keys_server.url)
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    expect(page.locator("#key-reason")).to_contain_text("wants an API key")
    page.fill("#key-input", "fm_not-a-key")
    page.click("#key-form button[type=submit]")
    expect(dialog).to_be_visible()
    expect(page.locator("#key-reason")).to_contain_text("refused this key")
    page.fill("#key-input", key)
    page.click("#key-form button[type=submit]")
    expect(dialog).to_be_hidden()
    expect(page.locator("#sessions li .row-title")).to_have_text(["Keyed"])
    expect(page.locator("#conn")).to_have_text("live")
    expect(page.locator("#key-button")).to_have_text(f"Key …{key[-4:]}")
    # The tab keeps the key across a reload.
    page.reload()
    expect(page.locator("#sessions li .row-title")).to_have_text(["Keyed"])
    expect(dialog).to_be_hidden()


def test_paging_past_200_sessions_search_and_filter(
    page: Page, keys_server: ServerProcess, quiet_db: str
) -> None:
    _, key = create_owner_key(quiet_db)
    total = 230
    with httpx.Client(
        base_url=keys_server.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as h:
        for i in range(total):
            body = {"prompt": f"session {i}", "title": f"paged {i:03d}"}
            assert h.post("/api/agent", json=body).status_code == 201
        page.goto(keys_server.url)
        page.evaluate("key => sessionStorage.setItem('ferryman.apiKey', key)", key)
        page.reload()
        rows = page.locator("#sessions li")
        expect(rows.first.locator(".row-title")).to_have_text(f"paged {total - 1:03d}")
        expect(page.locator("#list-count")).to_contain_text("more below")
        # Scrolling to the end loads the next page, until the oldest session is there.
        scroller = page.locator("#sessions-scroll")
        for _ in range(40):
            if page.locator("#more").is_hidden():
                break
            scroller.evaluate("box => { box.scrollTop = box.scrollHeight; }")
            page.wait_for_timeout(150)
        expect(rows).to_have_count(total)
        expect(rows.last.locator(".row-title")).to_have_text("paged 000")
        expect(page.locator("#list-count")).to_have_text(f"{total} sessions")
        ids = rows.evaluate_all("l => l.map(e => e.dataset.id)")
        assert len(set(ids)) == total
        # Live from the owner stream: a new session shows at the top, once.
        assert h.post("/api/agent", json={"prompt": "x", "title": "brand new"}).status_code == 201
        expect(rows.first.locator(".row-title")).to_have_text("brand new")
        expect(rows).to_have_count(total + 1)
        # Search goes to the server (titles of every page), and so does the status filter.
        page.fill("#search", "paged 00")
        expect(rows).to_have_count(10)
        page.fill("#search", "PAGED 123")
        expect(rows.locator(".row-title")).to_have_text(["paged 123"])
        page.fill("#search", "")
        page.select_option("#status-filter", "succeeded")
        expect(page.locator("#list-empty")).to_have_text("No session matches.")
        page.select_option("#status-filter", "queued")
        expect(rows).to_have_count(50)
        expect(page.locator("#more")).to_be_visible()


def test_the_server_restarted_under_an_open_page(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    script = [
        {"text": "First.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 2}}]},
        {"text": "Second.", "toolCalls": [{"name": "sleep", "arguments": {"seconds": 3}}]},
        {"text": "Third and last.", "chunks": 10, "delayMs": 1500},
    ]
    sid = create(http, "restart", title="Through a restart", script=script)["id"]
    open_session(page, web.url, sid)
    expect(card(page, "sleep")).to_have_attribute("data-status", "running")
    web.stop()
    expect(page.locator("#conn")).not_to_have_text("live")
    time.sleep(1.5)  # the worker goes on writing while no API server runs
    web.start()
    # Made while the page reconnects: the owner stream brings it, once.
    other = create(http, "after the restart", title="After the restart")["id"]
    expect(page.locator("#conn")).to_have_text("live")
    expect(page.locator("#status")).to_have_text("succeeded")
    expect(page.locator("#chat .msg.assistant .bubble").last).to_have_text("Third and last.")
    expect(page.locator(f"#sessions li[data-id='{other}']")).to_have_count(1)
    page.click("#tab-events")
    assert_log_matches(page, http, sid)
    bubbles = page.locator("#chat .msg.assistant .bubble").all_text_contents()
    assert bubbles == ["First.", "Second.", "Third and last."]
    page.click("#tab-chat")
    card(page, "sleep", 1).locator("summary").click()
    page.locator("#chat").evaluate("chat => { chat.scrollTop = chat.scrollHeight; }")
    snap(page, "conversation")
    titles = page.locator("#sessions li .row-title").all_text_contents()
    assert len(titles) == len(
        set(page.locator("#sessions li").evaluate_all("l => l.map(e => e.dataset.id)"))
    )
    wait_status(http, other, TERMINAL)


def test_a_narrow_screen(
    page: Page, web: ServerProcess, workers: Workers, http: httpx.Client
) -> None:
    script = [
        {
            "text": "Checking.",
            "toolCalls": [{"name": "put_note", "arguments": {"key": "a", "text": "b"}}],
        },
        {"text": "Fits on a phone."},
    ]
    sid = create(http, "narrow", title="On a phone", script=script)["id"]
    page.set_viewport_size({"width": 390, "height": 844})
    open_session(page, web.url, sid)
    expect(page.locator("#status")).to_have_text("succeeded")
    # The layout settles after the stream's last frames (the transcript and the list re-render):
    # the page's width is what it comes to, not a frame in between.
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function("() => document.documentElement.scrollWidth <= 390", timeout=5_000)
    width = page.evaluate("document.documentElement.scrollWidth")
    wide = page.evaluate(
        """() => [...document.querySelectorAll('body *')]
        .filter((e) => e.getBoundingClientRect().right > 391 || e.scrollWidth > e.clientWidth + 1)
        .filter((e) => getComputedStyle(e).overflowX !== 'auto' || e.tagName === 'BODY')
        .map((e) => `${e.tagName}#${e.id}.${e.className} ${e.scrollWidth}/${e.clientWidth}`)
        .slice(0, 8)"""
    )
    assert width <= 390, f"the page scrolls sideways ({width}px), past the edge: {wide}"
    snap(page, "narrow")
