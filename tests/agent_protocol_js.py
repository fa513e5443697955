"""What tests/test_agent_protocol_js.py and tests/test_agent_protocol_react.py share: the npm
packages of tests/js/agent_protocol (the official `@langchain/langgraph-sdk`, React, esbuild)
installed by `npm ci`, and the processes the JavaScript drives: a real API server and a real
worker on a database of their own, which a test restarts and SIGKILLs on the client's cue
through a small control server (POST /restart-api, POST /kill-worker).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.npm import Node, node_tools
from tests.support import (
    REPO,
    WORKER_ENV,
    ServerProcess,
    WorkerProcess,
    create_owner_key,
    stop_all,
)

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

PACKAGE = Path(REPO) / "tests" / "js" / "agent_protocol"
PREFIX = "/agent-protocol"
MIN_NODE = (20, 0)  # the SDK's own floor (its p-queue and p-retry want node >= 20)
# A killed worker's sessions are taken over once its lease lapses: short, so a test waits
# seconds, not the default ten.
WORKER = {**WORKER_ENV, "FERRYMAN_LEASE_TTL": "2"}


def sdk_node(what: str) -> Node:
    """node and npm, with the SDK, React and esbuild installed in PACKAGE."""
    return node_tools(PACKAGE, what, MIN_NODE)


@dataclass
class Stack:
    """An API server (keys mode, no worker of its own) and one worker on `database_url`. The
    API keeps its port across restarts, so a client reconnects to the same URL."""

    database_url: str
    api: ServerProcess = field(init=False)
    workers: list[WorkerProcess] = field(default_factory=list, init=False)
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.api = ServerProcess(
            self.database_url, env={"FERRYMAN_AUTH": "keys", "FERRYMAN_POLL_INTERVAL": "1"}
        )
        self.key = create_owner_key(self.database_url)[1]

    @property
    def protocol_url(self) -> str:
        return self.api.url + PREFIX

    def start(self) -> Stack:
        self.api.start()
        self.spawn_worker()
        return self

    def spawn_worker(self) -> None:
        worker = WorkerProcess(self.database_url, env=WORKER, concurrency=4).start()
        self.workers.append(worker)
        # Polled here, not with support.ready: Playwright's sync API holds this thread's loop.
        deadline = time.monotonic() + 30
        while "started (concurrency" not in worker.logs():
            assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
            assert time.monotonic() < deadline, f"worker not ready:\n{worker.logs()}"
            time.sleep(0.05)

    def restart_api(self) -> None:
        self.api.stop()
        self.api.start()

    def kill_worker(self) -> None:
        """SIGKILL the live worker and start another, which takes its sessions over."""
        worker = self.workers.pop()
        worker.signal(signal.SIGKILL)
        assert worker.proc is not None
        worker.proc.wait(10)
        self.spawn_worker()

    def stop(self) -> None:
        stop_all(self.workers)
        self.api.stop()

    def logs(self) -> str:
        worker = self.workers[-1].logs(3000) if self.workers else ""
        return f"--- API\n{self.api.logs(3000)}\n--- worker\n{worker}"


@contextlib.contextmanager
def running_stack(database_url: str) -> Iterator[Stack]:
    stack = Stack(database_url)
    try:
        yield stack.start()
    finally:
        stack.stop()


@contextlib.contextmanager
def control_server(
    stack: Stack, more: Mapping[str, Callable[[], None]] | None = None
) -> Iterator[str]:
    """An HTTP server on an ephemeral port whose POSTs act on `stack` and answer once done:
    `/restart-api` (SIGTERM the API, start it again on its port), `/kill-worker`, and the
    paths of `more`. Its URL."""
    actions = {"/restart-api": stack.restart_api, "/kill-worker": stack.kill_worker, **(more or {})}
    lock = threading.Lock()  # one action at a time, as the processes are one set

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            action = actions.get(self.path)
            if action is None:
                self.send_error(404)
                return
            try:
                with lock:
                    action()
                status, body = 200, b'{"ok": true}'
            except Exception as error:  # the client's test fails with what went wrong
                status, body = 500, json.dumps({"error": repr(error)}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the test reports what failed

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def record_texts(selector: str) -> str:
    """A page's init script keeping, in `window.__texts`, every text the elements of
    `selector` showed, in the order they showed it: proof that a reply grew token by token
    rather than landing whole."""
    return f"""
window.__texts = [];
new MutationObserver(() => {{
  for (const el of document.querySelectorAll({json.dumps(selector)})) {{
    const text = el.textContent;
    if (text && window.__texts.at(-1) !== text) window.__texts.push(text);
  }}
}}).observe(document, {{ subtree: true, childList: true, characterData: true }});
"""


@contextlib.contextmanager
def bundle_tab(
    browser: Browser, bundle: Path, origin: str, page_path: str, init_script: str
) -> Iterator[Page]:
    """A fresh tab whose context answers `origin + page_path` with a bundled example (the
    directory `bundle`: index.html and app.js), so that the page runs at the API's origin;
    the test fails on any script error in it."""
    context = browser.new_context()
    files = {"": "index.html", "index.html": "index.html", "app.js": "app.js"}
    types = {".html": "text/html", ".js": "text/javascript"}

    def answer(route: Route) -> None:
        name = files.get(route.request.url.split(page_path, 1)[1].split("?", 1)[0])
        if name is None:
            route.fulfill(status=404)
            return
        path = bundle / name
        route.fulfill(body=path.read_bytes(), content_type=types[path.suffix])

    context.route(re.compile(re.escape(origin + page_path) + ".*"), answer)
    context.add_init_script(init_script)
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    yield tab
    context.close()
    assert errors == [], errors


def protocol_http(stack: Stack) -> httpx.Client:
    """A plain HTTP client of the protocol's root, with the stack's key as the SDKs send it."""
    return httpx.Client(base_url=stack.protocol_url, headers={"x-api-key": stack.key}, timeout=30)


def scripted_thread(
    stack: Stack, name: str, script: list[dict[str, Any]], prompt: str
) -> tuple[str, str]:
    """A thread of a new stored assistant on the scripted model (SPEC section 6), made through
    the protocol as tests/js/agent_protocol/harness.mjs makes them (the definition in the
    assistant's `context`, the script in its first run's), that has answered `prompt` with the
    script's first turn: the assistant's id and the thread's."""
    with protocol_http(stack) as http:
        assistant = http.post(
            "/assistants",
            json={"graph_id": "ferryman", "name": name, "context": {"model": "scripted"}},
        )
        assert assistant.status_code == 200, assistant.text
        thread = http.post("/threads", json={"metadata": {"test": name}})
        assert thread.status_code == 200, thread.text
        thread_id: str = thread.json()["thread_id"]
        run = http.post(
            f"/threads/{thread_id}/runs/wait",
            json={
                "assistant_id": assistant.json()["assistant_id"],
                "input": {"messages": [{"role": "user", "content": prompt}]},
                "context": {"script": script},
            },
        )
        assert run.status_code == 200, run.text
    return assistant.json()["assistant_id"], thread_id
