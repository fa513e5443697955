"""The `ferryman` command: serve, migrate, keys."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
from typing import Annotated, Any
from uuid import UUID

import typer
import uvicorn

from app.config import Settings, get_settings, is_loopback
from app.db import bootstrap, migrate
from app.db.pool import Database
from app.logs import configure as configure_logs
from app.store import keys as key_store

cli = typer.Typer(help="Ferryman: durable LLM agent sessions on PostgreSQL.", no_args_is_help=True)
keys_cli = typer.Typer(help="Manage API keys (stored hashed; shown once).", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")

OWNER_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


def _settings(**overrides: Any) -> Settings:
    settings = get_settings()
    updates = {key: value for key, value in overrides.items() if value is not None}
    return settings.model_copy(update=updates) if updates else settings


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def _check_mcp_servers(settings: Settings) -> None:
    """Refuse to start on an MCP config the worker could not use, saying what is wrong."""
    if settings.mcp_servers is None:
        return
    from app.agent.tools.mcp import McpConfigError, load_config

    try:
        load_config(settings.mcp_servers)
    except McpConfigError as exc:
        _fail(f"FERRYMAN_MCP_SERVERS: {exc}")


class _Server(uvicorn.Server):
    """uvicorn, but a signal first tells open SSE streams to end, so shutdown is not held up
    by clients that never hang up."""

    def handle_exit(self, sig: int, frame: Any) -> None:
        services = getattr(getattr(self.config.app, "state", None), "services", None)
        if services is not None:
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(services.shutdown.set)
        super().handle_exit(sig, frame)


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address [FERRYMAN_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [FERRYMAN_PORT].")] = None,
    worker: Annotated[
        bool, typer.Option("--worker/--no-worker", help="Run a worker in this process.")
    ] = True,
) -> None:
    """Run the API and a worker (on the embedded PostgreSQL unless DATABASE_URL is set)."""
    from app.main import create_app

    settings = _settings(host=host, port=port)
    configure_logs(settings.log_level, settings.log_format)
    if worker:
        _check_mcp_servers(settings)
    if settings.auth_mode == "local" and not is_loopback(settings.host):
        _fail(
            f"refusing to serve {settings.host} without API keys: local mode trusts every "
            "caller. Set FERRYMAN_AUTH=keys and create a key with "
            "`ferryman keys create --owner NAME`, or bind to 127.0.0.1."
        )
    typer.echo("Preparing the database ...", err=True)
    url = bootstrap.prepare(settings)
    if settings.auth_mode == "keys" and not _with_db(key_store.any_active, url):
        typer.secho(
            "warning: no API key exists yet, so every request will answer 401; create one with "
            "`ferryman keys create --owner NAME`",
            fg=typer.colors.YELLOW,
            err=True,
        )
    app = create_app(settings, url, with_worker=worker)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_graceful_shutdown=10,
        proxy_headers=False,
    )
    typer.echo(
        f"Ferryman on http://{settings.host}:{settings.port} (auth: {settings.auth_mode})",
        err=True,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down gracefully. Under the
    # default SIGTERM action the process would die on the spot, skipping the atexit hook that
    # stops the embedded PostgreSQL when its last user exits: exit normally instead.
    signal.signal(signal.SIGTERM, _exit_normally)
    _Server(config).run()


def _exit_normally(signum: int, frame: Any) -> None:
    raise SystemExit(0)


@cli.command("worker")
def worker_command(
    concurrency: Annotated[
        int | None,
        typer.Option(min=1, max=1000, help="Sessions run at once [FERRYMAN_WORKER_CONCURRENCY]."),
    ] = None,
) -> None:
    """Run a worker alone: claim sessions and drive them until SIGTERM/SIGINT."""
    from app.runtime.worker import Worker
    from app.services import Services

    settings = _settings(worker_concurrency=concurrency)
    configure_logs(settings.log_level, settings.log_format)
    _check_mcp_servers(settings)
    url = bootstrap.prepare(settings)

    async def run() -> None:
        services = Services.create(settings, url)
        await services.start()
        worker = Worker(settings, services.db, services.bus)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        try:
            await worker.run()
        finally:
            await services.stop()

    asyncio.run(run())


@cli.command("migrate")
def migrate_command() -> None:
    """Apply database migrations (safe to run from several replicas at once)."""
    settings = _settings()
    configure_logs(settings.log_level, settings.log_format)
    url = bootstrap.database_url(settings)
    revision = migrate.upgrade(url)
    typer.echo(f"database at revision {revision}")


def _with_db(work: Any, url: str | None = None) -> Any:
    """Run `work(conn)` in one transaction (preparing the database unless `url` is given)."""
    if url is None:
        settings = _settings()
        configure_logs("warning", settings.log_format)
        url = bootstrap.prepare(settings)

    async def run() -> Any:
        db = Database(url, min_size=1, max_size=1)
        await db.pool.open(wait=True)
        try:
            async with db.transaction() as conn:
                return await work(conn)
        finally:
            await db.close()

    return asyncio.run(run())


@keys_cli.command("create")
def keys_create(
    owner: Annotated[str, typer.Option(help="The owner the key acts as.")],
    name: Annotated[str, typer.Option(help="A label for the key.")] = "",
) -> None:
    """Create an API key and print it once."""
    if not OWNER_PATTERN.match(owner):
        _fail("--owner must be 1-128 characters of letters, digits and . _ @ -")
    row, key = _with_db(lambda conn: key_store.create_key(conn, owner, name))
    typer.echo(key)
    typer.echo(
        f"key {row['id']} for owner {owner!r}; store it now, it is not shown again", err=True
    )


@keys_cli.command("list")
def keys_list(
    owner: Annotated[str | None, typer.Option(help="Only this owner's keys.")] = None,
) -> None:
    """List keys (never the keys themselves)."""
    rows = _with_db(lambda conn: key_store.list_keys(conn, owner))
    for row in rows:
        state = "revoked" if row["revoked_at"] else "active"
        typer.echo(f"{row['id']}  {row['owner_id']:<20} {row['prefix']}…  {state}  {row['name']}")


@keys_cli.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (from `keys list`).")],
) -> None:
    """Revoke a key; requests with it answer 401 from then on."""
    try:
        parsed = UUID(key_id)
    except ValueError:
        _fail("KEY_ID must be a key id as `ferryman keys list` prints it")
        return
    if not _with_db(lambda conn: key_store.revoke_key(conn, parsed)):
        _fail(f"no active key {key_id}")
    typer.echo(f"revoked {key_id}")


def main() -> None:
    cli(sys.argv[1:])
