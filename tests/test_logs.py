"""Log lines carry what was said, not a library's internals."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from app import logs
from app.api.problems import OUTAGE_QUIET
from tests.support import ServerProcess, client, create_owner_key


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


def allow_connections(database_url: str, allowed: bool) -> None:
    """Open or close the database to new connections; closing it also ends every open one, as
    an outage would."""
    name = conninfo_to_dict(database_url)["dbname"]
    with psycopg.connect(make_conninfo(database_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                sql.Identifier(name), sql.SQL("true" if allowed else "false")
            )
        )
        if not allowed:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


def outage_warnings(server: ServerProcess) -> list[dict[str, object]]:
    lines = [line for line in server.logs(tail=None).splitlines() if line.startswith("{")]
    return [
        record
        for record in map(json.loads, lines)
        if str(record["event"]).startswith("database unavailable")
    ]


async def test_an_api_process_logs_each_database_outage_once(isolated_db: str) -> None:
    key = create_owner_key(isolated_db)[1]
    server = ServerProcess(isolated_db, env={"FERRYMAN_POOL_TIMEOUT": "1"}).start()
    try:
        async with client(server.url, key) as http:

            async def outage() -> None:
                allow_connections(isolated_db, False)
                try:
                    for _ in range(3):  # requests, one after another and at once
                        answers = await asyncio.gather(*(http.get("/api/agent") for _ in range(8)))
                        assert {a.status_code for a in answers} == {503}
                finally:
                    allow_connections(isolated_db, True)
                deadline = time.monotonic() + 15
                while (await http.get("/api/agent")).status_code != 200:
                    assert time.monotonic() < deadline, server.logs()
                    await asyncio.sleep(0.1)

            await outage()
            assert len(outage_warnings(server)) == 1, server.logs()
            await asyncio.sleep(OUTAGE_QUIET + 0.5)
            await outage()
            warnings = outage_warnings(server)
            assert len(warnings) == 2, server.logs()
            assert all(w["level"] == "warning" for w in warnings), warnings
    finally:
        server.stop()
