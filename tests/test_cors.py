"""Browser pages of another origin (FERRYMAN_CORS_ORIGINS): Debian's Chromium on a page served
from one port calls a real API on another, with an API key in a header, through the native API
and the Agent Protocol, and reads a streamed run and the headers the LangGraph SDKs follow; an
origin not listed, and a server with no origins set, answer no CORS at all."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.support import ServerProcess, create_owner_key, free_port, running
from tests.test_workbench import browser  # noqa: F401 - Debian's Chromium, one per module

pytestmark = pytest.mark.once

if TYPE_CHECKING:
    from playwright.sync_api import Browser


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    """A page of another origin than the API's: an empty document on a port of its own."""

    class Blank(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>frontend</title>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Blank)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture(scope="module")
def cors_api(isolated_db: str, page_origin: str) -> Iterator[tuple[ServerProcess, str]]:
    env = {"FERRYMAN_AUTH": "keys", "FERRYMAN_CORS_ORIGINS": f"https://other.test, {page_origin}"}
    with running(ServerProcess(isolated_db, worker=True, env=env)) as api:
        yield api, create_owner_key(isolated_db)[1]


# The page's calls: a thread through the protocol, a run streamed on it (its Content-Location
# read), and a native session's events followed to its end.
CALLS = """async ([api, key]) => {
  const json = { "content-type": "application/json" };
  const thread = await (await fetch(`${api}/agent-protocol/threads`, {
    method: "POST", headers: { ...json, "x-api-key": key }, body: "{}",
  })).json();
  const run = await fetch(`${api}/agent-protocol/threads/${thread.thread_id}/runs/stream`, {
    method: "POST", headers: { ...json, "x-api-key": key },
    body: JSON.stringify({
      assistant_id: "ferryman", input: { messages: [{ role: "user", content: "hi" }] },
      context: { script: [{ text: "Hello from the worker." }] }, stream_mode: ["values"],
    }),
  });
  const runText = await run.text();
  const session = await (await fetch(`${api}/api/agent`, {
    method: "POST", headers: { ...json, authorization: `Bearer ${key}` },
    body: JSON.stringify({ prompt: "hi", model: "scripted", script: [{ text: "Native too." }] }),
  })).json();
  const events = await fetch(`${api}/api/agent/${session.id}/events`, {
    headers: { authorization: `Bearer ${key}` },
  });
  const reader = events.body.getReader();
  let eventsText = "";
  while (!eventsText.includes("session_end")) {
    const { value, done } = await reader.read();
    if (done) break;
    eventsText += new TextDecoder().decode(value);
  }
  await reader.cancel();
  return { thread: thread.thread_id, runLocation: run.headers.get("content-location"), runText,
           eventsText };
}"""


def test_a_page_of_another_origin_calls_the_api(
    browser: Browser,  # noqa: F811 - the fixture imported above
    cors_api: tuple[ServerProcess, str],
    page_origin: str,
) -> None:
    api, key = cors_api
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(page_origin)
        got = page.evaluate(CALLS, [api.url, key])
    finally:
        context.close()
    assert got["runLocation"].startswith(f"/threads/{got['thread']}/runs/")
    assert "Hello from the worker." in got["runText"]
    assert "event: end" in got["runText"]
    assert "Native too." in got["eventsText"]


def test_preflight_and_origins_not_listed(cors_api: tuple[ServerProcess, str]) -> None:
    api, _ = cors_api
    asked = {
        "Origin": "https://other.test",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-api-key, content-type",
    }
    preflight = httpx.options(f"{api.url}/agent-protocol/threads", headers=asked)
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "https://other.test"
    assert "x-api-key" in preflight.headers["access-control-allow-headers"].lower()
    assert preflight.headers["access-control-max-age"] == "600"

    stranger = {**asked, "Origin": "https://evil.test"}
    refused = httpx.options(f"{api.url}/agent-protocol/threads", headers=stranger)
    assert refused.status_code == 400
    assert "access-control-allow-origin" not in refused.headers
    plain = httpx.get(f"{api.url}/healthz", headers={"Origin": "https://evil.test"})
    assert "access-control-allow-origin" not in plain.headers


def test_no_origins_no_cors(server: ServerProcess) -> None:
    response = httpx.get(f"{server.url}/healthz", headers={"Origin": "https://other.test"})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers
