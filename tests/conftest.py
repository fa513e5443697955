"""Fixtures: a real PostgreSQL (the embedded one, or DATABASE_URL), a fresh database per test
run, and real `ferryman serve` processes for anything that streams.

Each test is marked `unit`, `integration` or `e2e` by what it uses (`pytest -m unit` needs no
PostgreSQL); see `pytest_collection_modifyitems`.

Modules that start workers use a database of their own (`isolated_db`, and the `api`, `key`,
`start_worker` and `shared_worker` on it): workers claim any queued session in their database,
so sharing the session-wide one would let them run other tests' sessions (and other tests'
workers run theirs).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest

from app.db.pool import Database
from tests.fake_provider import FakeProvider, serving
from tests.llm.server import LlamaServer, llama_server, require_xllamacpp
from tests.llm.tiny_model import write_tiny_model
from tests.support import (
    WORKER_ENV,
    ServerProcess,
    StartWorker,
    WorkerProcess,
    create_owner_key,
    fresh_database,
    running,
    stop_all,
)

# Every server and worker the tests start inherits these unless a test says otherwise: no test
# reaches a real model provider (nor spends a developer's key), and a session naming one fails
# at once instead of holding a worker's slot through retries (the shared database keeps such
# sessions, made by API tests, where later tests' workers claim them).
for name, value in {
    "FERRYMAN_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "FERRYMAN_ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
    "FERRYMAN_MODEL_MAX_RETRIES": "0",
    # The tests script their models, in keys mode too (off there by default: docs/tenants.md;
    # tests/test_scopes.py runs servers without it).
    "FERRYMAN_SCRIPTED_MODEL": "true",
}.items():
    os.environ[name] = value


# What a test stands on, from the fixtures it uses (directly or through others): a process of
# the server or a worker (or a browser, a pooler) makes it end-to-end, a database alone an
# integration test, neither a unit test. Module fixtures count by name.
PROCESS_FIXTURES = frozenset(
    {
        *("server", "api", "start_worker", "shared_worker"),  # here
        *("served", "bounded_api", "limited", "keys_server", "local_server", "other_server"),
        *("small_writes", "web", "browser", "bouncer", "llm", "cluster", "jwt_server"),
    }
)
DATABASE_FIXTURES = frozenset(
    {
        *("database_url", "isolated_db"),  # here
        *("database", "crowded", "empty_database", "recovery_db", "quiet_db"),
    }
)
# Where the fixture rule cannot see it: modules (or `module::test`s) that make databases or
# start processes in their bodies: PostgreSQL itself, `ferryman` commands, pip (e2e); MCP
# servers and llama.cpp's server, real parts of other makers (integration).
KIND_OF = {
    "test_chaos": "e2e",
    "test_partitions": "e2e",
    "test_cli": "e2e",
    "test_failover": "e2e",
    "test_cli_imports": "e2e",
    "test_claim": "integration",
    "test_coalesce::test_pages_of_several_sessions_read_as_one_session_at_a_time": "integration",
    "test_tiny_model_smoke": "integration",
    "test_mcp_tools::test_stdio_tools_are_listed_and_called": "integration",
    "test_mcp_tools::test_cancelling_a_call_cancels_it_on_the_server": "integration",
    "test_mcp_tools::test_a_server_that_dies_is_restarted": "integration",
    "test_mcp_tools::test_streamable_http_with_headers_and_a_restart": "integration",
    "test_mcp_tools::test_a_refused_http_server_is_not_connected": "integration",
    "test_mcp_tools::test_the_published_time_server": "integration",
    "test_model_runs": "e2e",
    "test_packaging": "e2e",
    "test_startup": "e2e",
    "test_embedded": "e2e",
    "test_embedded_supervision": "e2e",
    "test_db_restart": "e2e",
    "test_tracing::test_a_bad_exporter_stops_the_command_at_start_up": "e2e",
    "test_jwt::test_rotation_refetches_at_a_bounded_rate": "e2e",
    "test_jwt::test_an_unreachable_key_set_is_401_until_it_answers": "e2e",
    # A JWKS server of the test's own (a thread).
    "test_jwt::test_any_token_is_refused_as_unauthorized": "integration",
    "test_jwt::test_what_a_key_set_may_hold": "integration",
}


def kind_of(item: pytest.Item) -> str:
    """`unit`, `integration` or `e2e`: what the test needs running."""
    module = item.path.stem
    name = getattr(item, "originalname", item.name)
    explicit = KIND_OF.get(f"{module}::{name}") or KIND_OF.get(module)
    if explicit:
        return explicit
    used = set(getattr(item, "fixturenames", ()))
    if used & PROCESS_FIXTURES:
        return "e2e"
    if used & DATABASE_FIXTURES:
        return "integration"
    return "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(kind_of(item))


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh, migrated database for this test run, dropped afterwards."""
    with fresh_database("ferryman_test") as url:
        yield url


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[ServerProcess]:
    """One `ferryman serve` shared by the tests that do not need a server of their own."""
    with running(ServerProcess(database_url)) as proc:
        yield proc


@pytest.fixture
def owner_key(database_url: str) -> tuple[str, str]:
    """A fresh owner (so tests never see each other's sessions) and its API key."""
    return create_owner_key(database_url)


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url, min_size=1, max_size=10)
    await database.pool.open(wait=True)
    yield database
    await database.close()


# --- a database of the module's own, for modules that run workers ------------------------------


@pytest.fixture(scope="module")
def isolated_db() -> Iterator[str]:
    """A fresh, migrated database on the test server, for this module's workers alone."""
    with fresh_database("ferryman_test") as url:
        yield url


@pytest.fixture(scope="module")
def api(isolated_db: str) -> Iterator[ServerProcess]:
    """An API server (no worker) on the module's database."""
    with running(ServerProcess(isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"})) as proc:
        yield proc


@pytest.fixture
def key(isolated_db: str) -> str:
    """A fresh owner's API key on the module's database."""
    return create_owner_key(isolated_db)[1]


@pytest.fixture
def start_worker(isolated_db: str) -> Iterator[StartWorker]:
    """Start `ferryman worker` processes; all are stopped when the test ends, and sessions the
    test left unfinished are closed so no later test's worker picks them up."""
    started: list[WorkerProcess] = []

    def start(env: dict[str, str] | None = None, concurrency: int = 4) -> WorkerProcess:
        worker = WorkerProcess(
            isolated_db, env={**WORKER_ENV, **(env or {})}, concurrency=concurrency
        )
        started.append(worker.start())
        return worker

    yield start
    stop_all(started)
    with psycopg.connect(isolated_db, autocommit=True) as conn:
        conn.execute(
            "UPDATE sessions SET status = 'cancelled', lease_worker_id = NULL, lease_pid = NULL,"
            " lease_expires_at = NULL WHERE status NOT IN ('succeeded', 'failed', 'cancelled')"
        )


@pytest.fixture(scope="module")
def shared_worker(isolated_db: str) -> Iterator[WorkerProcess]:
    """One plain worker for the tests of a module that need nothing special of it."""
    worker = WorkerProcess(isolated_db, env=WORKER_ENV, concurrency=4).start()
    yield worker
    stop_all([worker])


# --- a model provider that misbehaves on cue ---------------------------------------------------


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    """The fake provider of tests/fake_provider.py, one per module that asks for it."""
    with serving() as fake:
        yield fake


@pytest.fixture
def fake(provider: FakeProvider) -> FakeProvider:
    """The module's fake provider with no answers queued and no requests seen."""
    provider.reset()
    return provider


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """llama.cpp's server on the tiny deterministic model, one per module that asks for it."""
    require_xllamacpp()
    model = write_tiny_model(tmp_path_factory.mktemp("llm") / "tiny.gguf")
    with llama_server(model) as server:
        yield server
