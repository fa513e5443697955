"""The `ferryman` command (`python -m app`), run as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest

from app.db import migrate
from tests import support
from tests.support import REPO, ServerProcess, client, free_port


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def cli_env(database_url: str | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("FERRYMAN_AUTH", "FERRYMAN_HOST", "FERRYMAN_PORT")
    }
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    env["FERRYMAN_LOG_FORMAT"] = "console"
    env.update(extra)
    return env


async def ferryman(*args: str, env: dict[str, str], timeout: float = 60) -> Result:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        env=env,
        cwd=REPO,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(
            f"`ferryman {' '.join(args)}` still running after {timeout}s:\n{err.decode()[-2000:]}"
        ) from None
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


async def test_keys_create_list_revoke(server: ServerProcess, database_url: str) -> None:
    env = cli_env(database_url)
    owner = f"cli-{uuid.uuid4().hex[:8]}@example.com"

    created = await ferryman("keys", "create", "--owner", owner, "--name", "laptop", env=env)
    assert created.returncode == 0, created.stderr
    lines = created.stdout.splitlines()
    assert len(lines) == 1, created.stdout  # the key alone on stdout, for scripts
    key = lines[0].strip()
    assert key.startswith("fm_")
    assert len(key) >= 40
    match = re.search(r"key ([0-9a-f-]{36})", created.stderr)
    assert match, created.stderr
    key_id = match.group(1)

    # The key works, as its owner.
    async with client(server.url, key) as http:
        response = await http.post("/api/agent", json={"prompt": "from the cli"})
        assert response.status_code == 201
        assert response.json()["ownerId"] == owner

    # Only a digest is stored.
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT owner_id, name, key_hash, prefix FROM api_keys WHERE id = %s", (key_id,)
        ).fetchone()
    assert row is not None
    assert row[0] == owner and row[1] == "laptop"
    assert key not in row[2] and len(row[3]) < len(key)

    listed = await ferryman("keys", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert key not in listed.stdout + listed.stderr  # never shown again
    assert key[:12] not in listed.stdout
    line = next(line for line in listed.stdout.splitlines() if key_id in line)
    assert owner in line and "active" in line and "laptop" in line

    revoked = await ferryman("keys", "revoke", key_id, env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout

    async with client(server.url, key) as http:
        response = await http.get("/api/agent")
        assert response.status_code == 401
        assert response.json()["code"] == "INVALID_API_KEY"

    again, listed = await asyncio.gather(
        ferryman("keys", "revoke", key_id, env=env),
        ferryman("keys", "list", "--owner", owner, env=env),
    )
    assert again.returncode != 0
    assert "no active key" in again.stderr
    assert listed.returncode == 0, listed.stderr
    header, *rows = [line for line in listed.stdout.splitlines() if line.strip()]
    assert header.split() == ["ID", "OWNER", "PREFIX", "STATE", "NAME", "POLICY"], listed.stdout
    assert len(rows) == 1 and key_id in rows[0]  # --owner filters
    assert rows[0].split()[:4] == [key_id, owner, f"{row[3]}…", "revoked"], listed.stdout
    assert rows[0].split()[4:] == ["laptop"]

    nobody = await ferryman("keys", "list", "--owner", f"nobody-{uuid.uuid4().hex[:8]}", env=env)
    assert nobody.returncode == 0, nobody.stderr
    assert nobody.stdout.startswith("no keys for owner"), nobody.stdout


async def test_keys_create_with_a_policy(database_url: str) -> None:
    """--priority, --creates-per-minute and --messages-per-minute are the key's policy
    (docs/tenants.md); a value out of bounds is refused, naming its option."""
    env = cli_env(database_url)
    owner = f"cli-{uuid.uuid4().hex[:8]}"
    created = await ferryman(
        "keys",
        "create",
        "--owner",
        owner,
        "--priority",
        "5",
        "--creates-per-minute",
        "3",
        env=env,
    )
    assert created.returncode == 0, created.stderr
    with psycopg.connect(database_url) as conn:
        (policy,) = conn.execute(
            "SELECT policy FROM api_keys WHERE owner_id = %s", (owner,)
        ).fetchone()  # type: ignore[misc]
    assert policy == {"priority": 5, "createsPerMinute": 3}
    listed = await ferryman("keys", "list", "--owner", owner, env=env)
    assert '{"priority":5,"createsPerMinute":3}' in listed.stdout, listed.stdout
    bad = await ferryman("keys", "create", "--owner", owner, "--messages-per-minute", "0", env=env)
    assert bad.returncode != 0 and "--messages-per-minute" in bad.stderr, bad.stderr


async def test_keys_commands_reject_bad_arguments(database_url: str) -> None:
    env = cli_env(database_url)
    bad_owners = ["", "has space/ünï", "-leading-dash", "x" * 129]
    results = await asyncio.gather(
        *(ferryman("keys", "create", f"--owner={owner}", env=env) for owner in bad_owners),
        ferryman("keys", "create", env=env),
        ferryman("keys", "revoke", "not-a-uuid", env=env),
        ferryman("keys", "revoke", str(uuid.uuid4()), env=env),
    )
    *owners, missing, bad_id, unknown_id = results
    for owner, result in zip(bad_owners, owners, strict=True):
        assert result.returncode != 0, owner
        assert "--owner" in result.stderr, (owner, result.stderr)
        assert "Traceback" not in result.stderr
        assert "fm_" not in result.stdout
    assert missing.returncode != 0
    assert "--owner" in missing.stderr
    assert bad_id.returncode != 0 and "KEY_ID" in bad_id.stderr
    assert unknown_id.returncode != 0 and "no active key" in unknown_id.stderr
    for result in (missing, bad_id, unknown_id):
        assert "Traceback" not in result.stderr

    # None of the refused owners got a key.
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT owner_id FROM api_keys WHERE owner_id = ANY(%s)", (bad_owners,)
        ).fetchall()
    assert rows == []


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A database with no schema at all."""
    with support.empty_database("ferryman_cli") as url:
        yield url


async def test_migrate_is_idempotent(empty_database: str) -> None:
    env = cli_env(empty_database)
    head = migrate.head_revision()
    assert head
    # Two replicas migrating an empty database at once take turns (an advisory lock) ...
    first = await asyncio.gather(ferryman("migrate", env=env), ferryman("migrate", env=env))
    # ... and a later run finds nothing to do.
    again = await ferryman("migrate", env=env)
    for result in (*first, again):
        assert result.returncode == 0, result.stderr
        assert head in result.stdout
    assert again.stdout == first[0].stdout == first[1].stdout
    with psycopg.connect(empty_database) as conn:
        versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        }
    assert versions == [(head,)]
    assert {"sessions", "session_events", "owner_events", "api_keys"} <= tables


async def test_serve_refuses_local_mode_on_a_public_address() -> None:
    # No database is needed (none is given): the refusal comes before anything starts.
    refused = await asyncio.gather(
        ferryman(
            "serve",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
            env=cli_env(None, FERRYMAN_AUTH="local"),
        ),
        ferryman(
            "serve",
            env=cli_env(None, FERRYMAN_AUTH="local", FERRYMAN_HOST="::", FERRYMAN_PORT="1"),
        ),
    )
    for result in refused:
        assert result.returncode != 0, result.stderr
        assert "FERRYMAN_AUTH" in result.stderr
        assert "Traceback" not in result.stderr


def test_serve_on_a_public_address_requires_keys(database_url: str) -> None:
    """Without FERRYMAN_AUTH, a non-loopback bind runs in keys mode: nobody is `local`."""
    assert "FERRYMAN_AUTH" not in os.environ
    proc = ServerProcess(database_url, args=["--host", "0.0.0.0"]).start()
    try:
        response = httpx.get(f"{proc.url}/api/agent", timeout=10)
        assert response.status_code == 401
        assert response.json()["code"] == "AUTH_REQUIRED"
        assert "auth: keys" in proc.logs()
    finally:
        proc.stop()


async def test_a_direct_url_wants_a_database_url() -> None:
    """FERRYMAN_DIRECT_DATABASE_URL names what sits behind DATABASE_URL's pooler: alone, it is a
    mistake (the embedded server would take the pool, the direct URL the rest)."""
    env = {
        k: v for k, v in cli_env(None).items() if k not in ("DATABASE_URL", "FERRYMAN_DATABASE_URL")
    }
    env["FERRYMAN_DIRECT_DATABASE_URL"] = "postgresql://postgres@127.0.0.1:1/none"
    for command in ("worker", "migrate"):
        result = await ferryman(command, env=env)
        assert result.returncode == 2, result.stderr
        assert "FERRYMAN_DIRECT_DATABASE_URL is set but DATABASE_URL is not" in result.stderr
        assert "Traceback" not in result.stderr
