"""Start-up failures: every command that cannot start exits non-zero within 5 s, with one line
that says what is wrong and what to do (and the traceback only when asked for). Real
processes, as a user runs them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from psycopg.conninfo import make_conninfo

from app.config import Settings
from app.main import create_app
from tests import support
from tests.support import REPO, free_port
from tests.test_cli import Result, cli_env, ferryman

# Each failing command must be done within this many seconds (the bound).
BUDGET = 5.0
COMMANDS = (["serve"], ["worker"], ["migrate"], ["keys", "list"])


def assert_fails_clearly(result: Result, *words: str) -> str:
    """The process failed with exactly one `error:` line holding `words`, and no traceback;
    that line."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for word in words:
        assert word in errors[0], (word, errors[0])
    assert "FERRYMAN_LOG_LEVEL=debug" in errors[0]  # how to see more
    assert "Traceback" not in result.stderr
    assert "Ferryman on" not in result.stderr
    return errors[0]


async def run_all(commands: tuple[list[str], ...], env: dict[str, str]) -> list[Result]:
    # One after the other: each must fail within the budget on its own, and four interpreters
    # starting at once on a busy 2-core machine measured the machine, not the command.
    return [await ferryman(*c, env=env, timeout=BUDGET) for c in commands]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("ferryman_no_such_module:tools", ["No module named 'ferryman_no_such_module'"]),
        ("json:no_such_tool", ["has no attribute 'no_such_tool'"]),
        ("json:dumps", ["not a ferryman Tool"]),
        ("json", ["json is not module:attribute"]),
    ],
)
async def test_bad_tool_modules(database_url: str, spec: str, words: list[str]) -> None:
    env = cli_env(database_url, FERRYMAN_TOOL_MODULES=spec)
    for result in await run_all((["serve"], ["serve", "--no-worker"], ["worker"]), env):
        assert_fails_clearly(result, "FERRYMAN_TOOL_MODULES", *words)


@contextlib.asynccontextmanager
async def refusing_passwords() -> AsyncIterator[int]:
    """A PostgreSQL stand-in on a free port that turns down every password, as a server does
    a wrong one (the test servers trust every local user, so they cannot)."""

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # SSL and GSS encryption requests first: refused, so plain text
                body = await _message(reader, typed=False)
                if int.from_bytes(body[:4], "big") not in (80877103, 80877104):
                    break  # the startup message
                writer.write(b"N")
                await writer.drain()
            writer.write(b"R" + (8).to_bytes(4, "big") + (3).to_bytes(4, "big"))
            await _message(reader, typed=True)  # the password
            fields = b'SFATAL\0VFATAL\0C28P01\0Mpassword authentication failed for user "fm"\0\0'
            writer.write(b"E" + (len(fields) + 4).to_bytes(4, "big") + fields)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(session, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


async def _message(reader: asyncio.StreamReader, *, typed: bool) -> bytes:
    if typed:
        await reader.readexactly(1)
    length = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(length - 4)


async def test_a_database_url_that_cannot_be_parsed() -> None:
    env = cli_env("postgresql://fm:s3cret-pw@[::1/ferryman")
    for result in await run_all(COMMANDS, env):
        line = assert_fails_clearly(result, "DATABASE_URL is not a connection string")
        assert "postgresql://USER:PASSWORD@HOST:PORT/DATABASE" in line
        assert "s3cret-pw" not in result.stderr


async def test_a_database_nothing_listens_on() -> None:
    port = free_port()
    env = cli_env(f"postgresql://fm@127.0.0.1:{port}/ferryman")
    for result in await run_all(COMMANDS, env):
        assert_fails_clearly(
            result, "cannot use the database at", f"port={port}", "check the host, port"
        )


async def test_a_wrong_password() -> None:
    async with refusing_passwords() as port:
        env = cli_env(f"postgresql://fm:s3cret-pw@127.0.0.1:{port}/ferryman?sslmode=disable")
        for result in await run_all(COMMANDS, env):
            assert_fails_clearly(result, "password authentication failed", "password=***")
            assert "s3cret-pw" not in result.stderr


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"dbname": "ferryman_no_such_database"}, ['"ferryman_no_such_database" does not exist']),
        ({"user": "ferryman_no_such_role"}, ['"ferryman_no_such_role" does not exist']),
    ],
)
async def test_a_database_or_user_the_server_does_not_know(
    change: dict[str, str], words: list[str]
) -> None:
    env = cli_env(make_conninfo(support.server_url(), **change))
    for result in await run_all(COMMANDS, env):
        assert_fails_clearly(result, "cannot use the database at", *words)


async def test_an_embedded_database_that_cannot_start() -> None:
    env = cli_env(None, FERRYMAN_DATA_DIR="/proc/ferryman-cannot-be-here")
    for name in ("DATABASE_URL", "FERRYMAN_DATABASE_URL"):
        env.pop(name, None)
    for result in await run_all(COMMANDS, env):
        assert_fails_clearly(result, "embedded PostgreSQL in /proc/ferryman-cannot-be-here")


@pytest.mark.parametrize(
    ("variables", "words"),
    [
        (
            {"FERRYMAN_PORT": "abc", "FERRYMAN_AUTH": "maybe"},
            [
                "FERRYMAN_PORT='abc'",
                "valid integer",
                "FERRYMAN_AUTH='maybe'",
                "'local', 'keys' or 'jwt'",
            ],
        ),
        (
            {"FERRYMAN_AUTH": "jwt", "FERRYMAN_JWT_JWKS_URL": "https://idp.test/jwks.json"},
            ["FERRYMAN_AUTH=jwt needs FERRYMAN_JWT_ISSUER and FERRYMAN_JWT_AUDIENCE"],
        ),
        ({"FERRYMAN_JWT_ALGORITHMS": "HS256"}, ["FERRYMAN_JWT_ALGORITHMS='HS256'", "HS256 is not"]),
        ({"FERRYMAN_HEARTBEAT_INTERVAL": "soon"}, ["FERRYMAN_HEARTBEAT_INTERVAL='soon'"]),
        ({"FERRYMAN_LOG_LEVEL": "verbose"}, ["FERRYMAN_LOG_LEVEL='verbose'", "debug, info"]),
    ],
)
async def test_invalid_settings(
    database_url: str, variables: dict[str, str], words: list[str]
) -> None:
    for result in await run_all(COMMANDS, cli_env(database_url, **variables)):
        assert_fails_clearly(result, *words)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_serve_where_it_cannot_listen(database_url: str, taken_port: int) -> None:
    env = cli_env(database_url)
    in_use, out_of_range, not_ours = await asyncio.gather(
        ferryman("serve", "--port", str(taken_port), env=env, timeout=BUDGET),
        ferryman("serve", env={**env, "FERRYMAN_PORT": "70000"}, timeout=BUDGET),
        # TEST-NET-3: an address no machine has.
        ferryman(
            "serve", "--host", "203.0.113.9", env={**env, "FERRYMAN_AUTH": "keys"}, timeout=BUDGET
        ),
    )
    assert_fails_clearly(in_use, f"127.0.0.1:{taken_port}", "in use", "--port")
    assert_fails_clearly(out_of_range, "port 70000", "FERRYMAN_PORT")
    assert_fails_clearly(not_ours, "203.0.113.9", "FERRYMAN_HOST")


@pytest.mark.parametrize("how", [["--debug"], []])
async def test_debug_shows_the_traceback(how: list[str]) -> None:
    env = cli_env(None, FERRYMAN_TOOL_MODULES="ferryman_no_such_module:tools")
    if not how:
        env["FERRYMAN_LOG_LEVEL"] = "DEBUG"
    result = await ferryman(*how, "worker", env=env, timeout=BUDGET)
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert "ModuleNotFoundError: No module named 'ferryman_no_such_module'" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: FERRYMAN_TOOL_MODULES=")
    assert "--debug" not in last  # no hint to do what was done


async def test_ferryman_on_appears_once_the_server_answers(database_url: str) -> None:
    """The line names the port the server listens on (here one the OS chose), and by the time
    it appears the server answers."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "app", "serve", "--no-worker", "--port", "0"),
        env=cli_env(database_url),
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while not (line := (await proc.stderr.readline()).decode()).startswith("Ferryman on"):
                assert line, "the server exited without saying where it listens"
        url = line.split()[2]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), line
        async with httpx.AsyncClient() as http:
            response = await http.get(f"{url}/healthz", timeout=5)
        assert response.status_code == 200
    finally:
        proc.terminate()
        await proc.wait()


async def test_a_failing_start_stops_what_it_started(database_url: str) -> None:
    """The lifespan, under any ASGI server: a step that fails (here the worker's plug-in tools,
    loaded after the pool and the bus started) leaves nothing running, so the process exits."""
    settings = Settings(tool_modules="ferryman_no_such_module:tools")
    app = create_app(settings, database_url, with_worker=True)
    with pytest.raises(ModuleNotFoundError):
        async with app.router.lifespan_context(app):
            pytest.fail("the lifespan started")
    assert app.state.services.db.pool.closed
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert not [t for t in others if not t.done()], others
