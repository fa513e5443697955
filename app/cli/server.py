"""The server commands: serve, worker, migrate, keys, added to ferryman-client's `ferryman`
command through the `ferryman.cli` entry point (`register`, named in pyproject.toml).

A command that cannot start says why on one line and exits non-zero (2 for what the user can
fix: settings, plug-ins, the database, the port; 1 for anything unexpected); `--debug` adds the
traceback. Every server module (settings, the app, the database layers, uvicorn, even asyncio)
is imported inside the commands: `ferryman --help` loads this module and must not pay for them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import socket
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ferryman.cli.common import (
    DEBUG_HINT,
    Exit,
    Group,
    debugging,
    fail,
    one_line,
    table_console,
)

if TYPE_CHECKING:
    from pydantic import ValidationError

    from app.config import Settings


@click.group("keys", cls=Group, no_args_is_help=True)
def keys_cli() -> None:
    """Manage API keys (stored hashed; shown once)."""


T = TypeVar("T")


class StartupFailure(Exception):
    """A command cannot start; the message says what is wrong and what to do, on one line."""


@contextlib.contextmanager
def _starting() -> Iterator[None]:
    """Report a failure to start as one line on stderr, and exit non-zero."""
    try:
        yield
    except (Exit, click.Abort):
        raise
    except Exception as exc:
        known = isinstance(exc, StartupFailure)
        message = str(exc) if known else f"{type(exc).__name__}: {one_line(exc)}"
        if debugging():
            traceback.print_exc()
        else:
            message = f"{message} ({DEBUG_HINT})"
        fail(message, code=2 if known else 1)


def _settings(**overrides: Any) -> Settings:
    from pydantic import ValidationError

    from app.config import get_settings

    try:
        settings = get_settings()
    except ValidationError as exc:
        raise StartupFailure(_invalid_settings(exc)) from exc
    if settings.direct_database_url and not settings.database_url:
        raise StartupFailure(
            "FERRYMAN_DIRECT_DATABASE_URL is set but DATABASE_URL is not: set DATABASE_URL to "
            "the pooler's URL (PgBouncer), or unset FERRYMAN_DIRECT_DATABASE_URL"
        )
    updates = {key: value for key, value in overrides.items() if value is not None}
    return settings.model_copy(update=updates) if updates else settings


def _invalid_settings(exc: ValidationError) -> str:
    """Each variable that is wrong, with its value and why (a rule between variables names
    them in its message)."""
    problems = "; ".join(
        f"FERRYMAN_{str(error['loc'][0]).upper()}={error['input']!r}: {error['msg']}"
        if error["loc"]
        else error["msg"]
        for error in exc.errors()
    )
    return f"{problems}; set a valid value or unset it"


def _configure_logs(settings: Settings, *, quiet: bool = False) -> None:
    """Logs as the settings say; `quiet`: warnings only unless debugging, for the commands
    whose output is the point."""
    from app.logs import LEVELS, configure

    if settings.log_level.lower() not in LEVELS:
        raise StartupFailure(
            f"FERRYMAN_LOG_LEVEL={settings.log_level!r} is not a log level; use one of "
            f"{', '.join(LEVELS)}"
        )
    configure("warning" if quiet and not debugging() else settings.log_level, settings.log_format)


def _configure_tracing(settings: Settings) -> None:
    """Traces as the OTEL_* variables say (docs/tracing.md); none unless they name an exporter."""
    from app import tracing

    try:
        tracing.setup(settings.trace_content)
    except tracing.TracingError as exc:
        raise StartupFailure(str(exc)) from exc


def _check_tools(settings: Settings, *, mcp: bool) -> None:
    """Refuse to start on plug-in tools or an MCP config the process could not use."""
    _check_tool_modules(settings)
    if mcp and settings.mcp_servers is not None:
        from app.agent.tools.mcp import McpConfigError, load_config

        try:
            load_config(settings.mcp_servers)
        except McpConfigError as exc:
            raise StartupFailure(f"FERRYMAN_MCP_SERVERS: {exc}") from exc


def _check_tool_modules(settings: Settings) -> None:
    specs = settings.tool_module_specs()
    if not specs:
        return
    what = f"FERRYMAN_TOOL_MODULES={settings.tool_modules!r}"
    todo = "each entry is module:attribute, naming a Tool or a list of Tools Python can import"
    malformed = [spec for spec in specs if not all(spec.partition(":")[::2])]
    if malformed:
        raise StartupFailure(f"{what}: {', '.join(malformed)} is not module:attribute; {todo}")
    from app.agent.tools import default_registry

    try:
        default_registry(specs)
    except Exception as exc:  # a plug-in's import may raise anything
        reason = f"{type(exc).__name__}: {one_line(exc)}"
        raise StartupFailure(f"{what} cannot be loaded ({reason}); {todo}") from exc


def _on_database(settings: Settings, step: Callable[[], T]) -> T:
    """`step()`, with a database it cannot reach or prepare reported as a StartupFailure that
    says which database and what to do."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    from app.db.urls import redact

    if settings.database_url:
        try:
            conninfo_to_dict(settings.database_url)
        except ProgrammingError as exc:
            # Not libpq's words: they quote the string, password and all.
            raise StartupFailure(
                "DATABASE_URL is not a connection string libpq can parse: use "
                "postgresql://USER:PASSWORD@HOST:PORT/DATABASE or libpq key=value pairs"
            ) from exc
        where = f"the database at {redact(settings.database_url)}"
        todo = (
            "check the host, port, user, password and database name in DATABASE_URL, and that "
            "the server is running"
        )
    else:
        where = f"the embedded PostgreSQL in {settings.data_dir / 'pg'}"
        todo = (
            "check that FERRYMAN_DATA_DIR is writable and holds no other PostgreSQL version's "
            "data, or set DATABASE_URL to use your own server"
        )
    from app.db.embedded import UnsafeRuntimeDir

    try:
        return step()
    except UnsafeRuntimeDir as exc:  # not the database's fault: it says itself what to do
        raise StartupFailure(str(exc)) from exc
    except Exception as exc:
        raise StartupFailure(f"cannot use {where}: {_database_reason(exc)}; {todo}") from exc


def _database_reason(exc: BaseException) -> str:
    """What the psycopg error under `exc` says (SQLAlchemy wraps the ones migrations meet);
    else `exc` with its type, which then says more than its message."""
    import psycopg

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, psycopg.Error):
        cause = cause.__cause__
    return one_line(cause) if cause is not None else f"{type(exc).__name__}: {one_line(exc)}"


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` and listening, or a StartupFailure saying why not.

    Bound before the database is prepared, so a port in use fails at once; listening at once,
    so two servers started together cannot both bind it (SO_REUSEADDR lets two sockets bind
    one port as long as neither listens)."""
    where = _url(host, port)
    if not 0 <= port <= 65535:
        raise StartupFailure(f"port {port} does not exist: set --port or FERRYMAN_PORT to 0..65535")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise StartupFailure(f"cannot listen on {where}: {_bind_problem(exc)}") from exc
    return sock


def _bind_problem(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (
            "the port is in use (another Ferryman?); stop what listens there, or choose "
            "another port with --port or FERRYMAN_PORT"
        )
    if exc.errno == errno.EACCES:
        return "permission denied; choose a port above 1024 with --port or FERRYMAN_PORT"
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return (
            f"{exc.strerror}: set --host or FERRYMAN_HOST to an address of this machine "
            "(127.0.0.1 for this machine alone)"
        )
    return one_line(exc)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@click.command(short_help="Run the API and a worker.")
@click.option("--host", metavar="HOST", help="Bind address [FERRYMAN_HOST].")
@click.option("--port", type=int, metavar="PORT", help="Port [FERRYMAN_PORT].")
@click.option(
    "--worker/--no-worker", default=True, show_default=True, help="Run a worker in this process."
)
def serve(host: str | None, port: int | None, worker: bool) -> None:
    """Run the API and a worker (on the embedded PostgreSQL unless DATABASE_URL is set)."""
    from app.config import is_loopback

    with _starting():
        settings = _settings(host=host, port=port)
        _configure_logs(settings)
        _configure_tracing(settings)
        # The API process loads the plug-in tools too (GET /api/tools); MCP servers only
        # a worker connects to.
        _check_tools(settings, mcp=worker)
        if settings.auth_mode == "local" and not is_loopback(settings.host):
            raise StartupFailure(
                f"refusing to serve {settings.host} without API keys: local mode trusts every "
                "caller. Set FERRYMAN_AUTH=keys and create a key with "
                "`ferryman keys create --owner NAME`, or bind to 127.0.0.1."
            )
        sock = _listen(settings.host, settings.port)
        click.echo("Preparing the database ...", err=True)
        url = _prepare(settings)
        if settings.auth_mode == "jwt":
            _warn_plain_jwks(settings)
        if settings.auth_mode == "keys" and not _any_active_key(settings, url):
            click.secho(
                "warning: no API key exists yet, so every request will answer 401; create one "
                "with `ferryman keys create --owner NAME`",
                fg="yellow",
                err=True,
            )
        import uvicorn

        from app.main import Server, create_app

        app = create_app(settings, url, with_worker=worker)
        # No access log (app/logs.py keeps it at WARNING: its lines carry query strings, and
        # `?access_token=` is a secret). Off here too, uvicorn does not even build its
        # arguments at every response.
        config = uvicorn.Config(
            app,
            log_config=None,
            timeout_graceful_shutdown=10,
            proxy_headers=False,
            access_log=False,
        )
        bound = _url(settings.host, sock.getsockname()[1])

    def started() -> None:
        click.echo(f"Ferryman on {bound} (auth: {settings.auth_mode})", err=True)

    # uvicorn re-raises the signal that stopped it once it has shut down gracefully. Under the
    # default SIGTERM action the process would die on the spot, skipping the atexit hook that
    # stops the embedded PostgreSQL when its last user exits: exit normally instead.
    signal.signal(signal.SIGTERM, _exit_normally)
    Server(config, on_started=started).run(sockets=[sock])


def _exit_normally(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _prepare(settings: Settings) -> str:
    """The database's URL, started (if embedded) and migrated."""
    from app.db import bootstrap

    return _on_database(settings, lambda: bootstrap.prepare(settings))


def _warn_plain_jwks(settings: Settings) -> None:
    """A key set fetched over plain HTTP can be swapped on the way for one that signs any
    token; on this machine or a private network that may be a choice, so a warning."""
    from urllib.parse import urlsplit

    from app.config import is_loopback

    parts = urlsplit(settings.jwt_jwks_url or "")
    if parts.scheme != "https" and not is_loopback(parts.hostname or ""):
        click.secho(
            f"warning: FERRYMAN_JWT_JWKS_URL {settings.jwt_jwks_url} is not https: whoever "
            "can change it on the way can sign tokens for any owner",
            fg="yellow",
            err=True,
        )


def _any_active_key(settings: Settings, url: str) -> bool:
    from app.store import keys as key_store

    return bool(
        _on_database(
            settings,
            lambda: _transaction(url, key_store.any_active, settings.direct_database_url),
        )
    )


@click.command("worker", short_help="Run a worker alone.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1000),
    metavar="N",
    help="Sessions run at once [FERRYMAN_WORKER_CONCURRENCY].",
)
def worker_command(concurrency: int | None) -> None:
    """Run a worker alone: claim sessions and drive them until SIGTERM/SIGINT."""
    with _starting():
        settings = _settings(worker_concurrency=concurrency)
        _configure_logs(settings)
        _configure_tracing(settings)
        _check_tools(settings, mcp=True)
        url = _prepare(settings)
    import asyncio

    try:
        import uvloop
    except ImportError:  # uvicorn[standard] brings it wherever it builds (not on Windows)
        asyncio.run(_run_worker(settings, url))
    else:
        # The API's loop too: half the CPU per timer and wake-up of asyncio's own, and a
        # worker streaming hundreds of sessions wakes thousands of times a second.
        uvloop.run(_run_worker(settings, url))


async def _run_worker(settings: Settings, url: str) -> None:
    import asyncio

    from app.runtime.worker import Worker
    from app.services import Services, calm_garbage_collector
    from app.store.notify import RUNS_CHANNEL

    services = Services.create(settings, url, (RUNS_CHANNEL,), settings.worker_pool_timeout)
    try:
        await services.start()
        worker = Worker(settings, services.db, services.bus)
        # Start-up's objects (modules, settings, pools) leave the collected generations: with
        # hundreds of runs, full collections that walked them paused the loop 100-350 ms.
        calm_garbage_collector()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        await worker.run()
    finally:
        await services.stop()


@click.command("migrate", short_help="Apply database migrations.")
def migrate_command() -> None:
    """Apply database migrations (safe to run from several replicas at once)."""
    from app.db import bootstrap, migrate

    with _starting():
        settings = _settings()
        _configure_logs(settings)
        revision = _on_database(
            settings,
            lambda: migrate.upgrade(
                bootstrap.direct_url(settings, bootstrap.database_url(settings))
            ),
        )
    click.echo(f"database at revision {revision}")


def _transaction(url: str, work: Callable[[Any], Any], direct_url: str | None = None) -> Any:
    """Run `work(conn)` in one transaction on `url` (a pooler's, if `direct_url` differs)."""
    import asyncio

    from app.db.pool import Database

    async def run() -> Any:
        db = Database(url, direct_url=direct_url, min_size=1, max_size=1)
        await db.pool.open(wait=True)
        try:
            async with db.transaction() as conn:
                return await work(conn)
        finally:
            await db.close()

    return asyncio.run(run())


def _with_db(work: Callable[[Any], Any]) -> Any:
    """Run `work(conn)` in one transaction on the prepared database (for the keys commands)."""
    with _starting():
        settings = _settings()
        _configure_logs(settings, quiet=True)
        url = _prepare(settings)
        return _on_database(settings, lambda: _transaction(url, work, settings.direct_database_url))


def _names(value: str | None) -> list[str] | None:
    """A comma-separated list option (None: not given; "": an empty list)."""
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


@keys_cli.command("create")
@click.option("--owner", required=True, metavar="OWNER", help="The owner the key acts as.")
@click.option("--name", default="", metavar="TEXT", help="A label for the key.")
@click.option(
    "--tools",
    metavar="NAMES",
    help="Only these tools, comma-separated (`mcp:<server>`: all of that MCP server's;"
    ' "": none). Unset: every tool.',
)
@click.option(
    "--models",
    metavar="NAMES",
    help="Only these models, comma-separated (`openai:gpt-4o`, or a provider prefix such as"
    " `openai:`). Unset: every model.",
)
@click.option(
    "--approver-for",
    metavar="OWNERS",
    help="Owners whose pending approvals the key may list and decide, comma-separated.",
)
@click.option(
    "--priority",
    type=int,
    metavar="N",
    help="The priority (-100..100) of the sessions it creates without one (docs/tenants.md).",
)
@click.option(
    "--creates-per-minute",
    type=int,
    metavar="N",
    help="Its creates a minute (instead of FERRYMAN_KEY_CREATES_PER_MINUTE).",
)
@click.option(
    "--messages-per-minute",
    type=int,
    metavar="N",
    help="Its messages a minute (instead of FERRYMAN_KEY_MESSAGES_PER_MINUTE).",
)
def keys_create(
    owner: str,
    name: str,
    tools: str | None,
    models: str | None,
    approver_for: str | None,
    priority: int | None,
    creates_per_minute: int | None,
    messages_per_minute: int | None,
) -> None:
    """Create an API key and print it once."""
    from pydantic import ValidationError

    from app.api.schemas import KeyPolicy
    from app.domain import check_owner_id
    from app.scopes import check_scopes
    from app.store import keys as key_store

    try:
        check_owner_id(owner)
    except ValueError as exc:
        fail(f"--owner: {exc}")
    given = {"tools": _names(tools), "models": _names(models), "approverFor": _names(approver_for)}
    try:
        limits = KeyPolicy(
            priority=priority,
            createsPerMinute=creates_per_minute,
            messagesPerMinute=messages_per_minute,
        ).stored()
        policy = {**limits, **check_scopes({k: v for k, v in given.items() if v is not None})}
    except ValidationError as exc:
        options = {
            "createsPerMinute": "creates-per-minute",
            "messagesPerMinute": "messages-per-minute",
        }
        first = exc.errors()[0]
        field = str(first["loc"][0])
        fail(f"--{options.get(field, field)}: {first['msg']}")
    except ValueError as exc:
        fail(f"the key's scopes: {exc}")
    row, key = _with_db(lambda conn: key_store.create_key(conn, owner, name, policy))
    click.echo(key)
    click.echo(
        f"key {row['id']} for owner {owner!r}; store it now, it is not shown again", err=True
    )


@keys_cli.command("list")
@click.option("--owner", metavar="OWNER", help="Only this owner's keys.")
def keys_list(owner: str | None) -> None:
    """List keys (never the keys themselves)."""
    from app.store import keys as key_store

    rows = _with_db(lambda conn: key_store.list_keys(conn, owner))
    if not rows:
        click.echo("no keys" + (f" for owner {owner!r}" if owner else ""))
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "OWNER", "PREFIX", "STATE", "NAME", "POLICY"):
        table.add_column(column, no_wrap=column not in ("NAME", "POLICY"))
    for row in rows:
        state = "revoked" if row["revoked_at"] else "active"
        # Owners and names are text, not rich markup.
        table.add_row(
            str(row["id"]),
            Text(row["owner_id"]),
            f"{row['prefix']}…",
            state,
            Text(row["name"]),
            Text(json.dumps(row["policy"], separators=(",", ":")) if row["policy"] else ""),
        )
    table_console().print(table, soft_wrap=False)


@keys_cli.command("revoke")
@click.argument("key_id", metavar="KEY_ID", help="The key's id (from `keys list`).")
def keys_revoke(key_id: str) -> None:
    """Revoke a key; requests with it answer 401 from then on."""
    from uuid import UUID

    from app.store import keys as key_store

    try:
        parsed = UUID(key_id)
    except ValueError:
        fail("KEY_ID must be a key id as `ferryman keys list` prints it")
    if not _with_db(lambda conn: key_store.revoke_key(conn, parsed)):
        fail(f"no active key {key_id}")
    click.echo(f"revoked {key_id}")


def register(cli: click.Group) -> None:
    """Add the server commands to `cli` (the `ferryman.cli` entry point, pyproject.toml)."""
    for command in (serve, worker_command, migrate_command, keys_cli):
        cli.add_command(command)
