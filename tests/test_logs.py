"""Log lines carry what was said, not a library's internals."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator

import httpx
import pytest

from app import logs


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_uvicorns_color_message_is_dropped(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", fmt)
    uvicorn_error = logging.getLogger("uvicorn.error")
    # Another test's in-process uvicorn.Config may have set this logger's own level.
    level, uvicorn_error.level, uvicorn_error.disabled = uvicorn_error.level, logging.INFO, False
    try:
        uvicorn_error.info(
            "Started server process [%d]",
            42,
            extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"},
        )
        line = capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
        uvicorn_error.setLevel(level)
    assert "Started server process [42]" in line
    assert "color_message" not in line and "\x1b" not in line and "\\x1b" not in line


@pytest.fixture
def http_server() -> Iterator[str]:
    """A real HTTP server on a free port that answers every GET with 204."""

    class NoContent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoContent)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join()


@pytest.mark.parametrize(("level", "said"), [("info", False), ("warning", False), ("debug", True)])
def test_provider_requests_are_logged_only_at_debug(
    level: str, said: bool, http_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """httpx (the openai and anthropic SDKs' client) says every request at info."""
    logs.configure(level, "console")
    try:
        with httpx.Client() as http:
            assert http.get(http_server).status_code == 204
        err = capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
        logs.configure("info", "console")
        logging.getLogger().handlers.clear()
    assert ("HTTP Request: GET" in err) is said, err
