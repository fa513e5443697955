"""A worker: claims sessions under leases and drives up to `concurrency` runs at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from typing import Any
from uuid import UUID

from pydantic import SecretStr

from app import tracing
from app.agent.models import ProviderConfig, Providers, RetryPolicy
from app.agent.tools import ToolRegistry, default_registry
from app.agent.tools.mcp import McpServer, load_config
from app.backoff import Outage
from app.bus import Bus
from app.config import Settings
from app.db.pool import UNAVAILABLE_ERRORS, Connection, Database
from app.domain import SessionErrorCode, Status
from app.runtime.budgets import ProviderBudgets
from app.runtime.deltas import DeltaHub
from app.runtime.heartbeat import Heartbeat
from app.runtime.runner import AbortReason, Run, RunContext
from app.runtime.scheduler import run_scheduler
from app.runtime.watcher import watch_peers
from app.runtime.writes import RunWrites
from app.services import database
from app.store import claims as claim_store
from app.store import liveness, settling
from app.store import tools as tool_store
from app.store.events import Fence, fence_errors
from app.store.notify import WORK_KEY, WORKERS_KEY, cancel_key, inbox_key
from app.store.run_writes import Batch
from app.webhooks.sender import Sender

log = logging.getLogger(__name__)


def provider_config(settings: Settings) -> ProviderConfig:
    def secret(value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value is not None else None

    return ProviderConfig(
        openai_base_url=settings.openai_base_url,
        openai_api_key=secret(settings.openai_api_key),
        anthropic_base_url=settings.anthropic_base_url,
        anthropic_api_key=secret(settings.anthropic_api_key),
        anthropic_max_tokens=settings.anthropic_max_tokens,
        idle_timeout=settings.model_idle_timeout,
        connect_timeout=settings.model_connect_timeout,
    )


def budgets_of(
    settings: Settings, db: Database, bus: Bus, worker_id: str
) -> ProviderBudgets | None:
    """The provider budgets (docs/budgets.md); None when none is configured: no statement."""
    budgets = settings.budgets()
    if not budgets:
        return None
    # A slot held by a call lasts a lease TTL and is renewed with the heartbeat, as leases are.
    return ProviderBudgets(
        db,
        bus,
        worker_id,
        budgets,
        ttl=settings.lease_ttl,
        renew_interval=settings.heartbeat_interval,
    )


def new_worker_id() -> str:
    return f"{secrets.token_hex(4)}:{os.getpid()}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        bus: Bus,
        *,
        registry: ToolRegistry | None = None,
        concurrency: int | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.bus = bus
        self.id = new_worker_id()
        self.concurrency = concurrency or settings.worker_concurrency
        # Token deltas go on a connection of their own: in the shared pool each flush queued
        # behind hundreds of runs starting or finishing at once, and held up every streaming
        # session's text for seconds. One flush at a time, so one connection.
        self.delta_db = database(
            settings, db.url, min_size=1, max_size=1, timeout=settings.pool_timeout
        )
        self.context = RunContext(
            db=db,
            registry=registry or default_registry(settings.tool_module_specs()),
            worker_id=self.id,
            pid=os.getpid(),
            tool_timeout=settings.tool_timeout,
            providers=Providers(provider_config(settings)),
            retry=RetryPolicy(
                max_retries=settings.model_max_retries,
                initial_delay=settings.model_retry_initial_delay,
                max_delay=settings.model_retry_max_delay,
            ),
            max_event_bytes=settings.max_event_bytes,
            tool_result_max_chars=settings.model_tool_result_max_chars,
            max_agent_depth=settings.max_agent_depth,
            read_page_bytes=settings.transcript_page_bytes,
            deltas=DeltaHub(self.delta_db, settings.delta_flush_interval),
            writes=RunWrites(self.db),
            budgets=budgets_of(settings, db, bus, self.id),
        )
        # MCP servers' connections live as long as the worker; their tools join the registry
        # each time a server (re)connects.
        self.mcp_servers = [
            McpServer(config, self._on_mcp_tools, config_file=settings.mcp_servers)
            for config in (load_config(settings.mcp_servers) if settings.mcp_servers else [])
        ]
        self.runs: dict[UUID, Run] = {}
        self.claims = Outage(log, "claiming (the database)")
        self.tasks: set[asyncio.Future[None]] = set()
        self.stopping = asyncio.Event()
        self.work = asyncio.Event()
        # Set when a run ends, so a worker whose slots were all taken claims again.
        self.slot_freed = asyncio.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- called from the heartbeat thread -----------------------------------------------

    def _held(self) -> list[UUID]:
        return list(self.runs)

    def _on_beat(self, still_held: dict[UUID, bool], lost: list[UUID]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._apply_beat, still_held, lost)

    def _apply_beat(self, still_held: dict[UUID, bool], lost: list[UUID]) -> None:
        for session_id in lost:
            self._abort(session_id, "lease_lost")
        for session_id, cancel in still_held.items():
            if cancel:
                self._abort(session_id, "cancelled")

    def _on_disconnect(self) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._abort_all, "lease_lost")

    # --- the claim loop ------------------------------------------------------------------

    def _abort(self, session_id: UUID, reason: AbortReason) -> None:
        run = self.runs.get(session_id)
        if run is not None:
            run.abort(reason)

    def _abort_all(self, reason: AbortReason) -> None:
        for session_id in list(self.runs):
            self._abort(session_id, reason)

    def stop(self) -> None:
        self.stopping.set()
        self.work.set()
        self.slot_freed.set()

    async def _send_webhooks(self) -> None:
        if self.settings.webhook_send:
            await Sender(self.settings, self.db).run()

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        # The liveness lock and the death watch's looks at its peer's are a session's: both on
        # the direct connection, never through a transaction-mode pooler.
        heartbeat = Heartbeat(
            self.db.direct_url,
            self.id,
            interval=self.settings.heartbeat_interval,
            ttl=self.settings.lease_ttl,
            held=self._held,
            on_beat=self._on_beat,
            on_disconnect=self._on_disconnect,
        )
        heartbeat.start()
        await asyncio.to_thread(heartbeat.registered.wait)
        await self._connect_mcp_servers()
        await self._publish_tools()
        log.info("worker %s started (concurrency %d)", self.id, self.concurrency)
        await self.delta_db.open()
        if self.context.budgets is not None:
            self.context.budgets.start()
        membership = asyncio.Event()
        watcher = asyncio.create_task(
            watch_peers(self.db.direct_url, self.id, membership), name="death watch"
        )
        # Every worker polls the schedules; each firing is one locked transaction, so a tick
        # fires once however many do (runtime/scheduler.py).
        scheduler = asyncio.create_task(
            run_scheduler(self.db, self.settings, self.stopping), name="scheduler"
        )
        # The webhooks' outbox: any process may send its deliveries (app/webhooks/sender.py).
        sender = asyncio.create_task(self._send_webhooks(), name="webhooks")
        try:
            with (
                self.bus.subscribe(WORK_KEY, lambda _: self.work.set()),
                self.bus.subscribe(WORKERS_KEY, lambda _: membership.set()),
            ):
                while not self.stopping.is_set():
                    free = self.concurrency - len(self.runs)
                    if free <= 0:
                        self.slot_freed.clear()
                        await self.slot_freed.wait()
                        continue
                    claimed = await self._claim(min(free, self.settings.claim_batch))
                    for run in claimed:
                        task = asyncio.create_task(self._drive(run), name=f"run {run.session_id}")
                        self.tasks.add(task)
                        task.add_done_callback(self.tasks.discard)
                    if not claimed:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self.work.wait(), self.settings.claim_interval)
                        self.work.clear()
        finally:
            # Shutdown: abort runs at a safe point; each writes session_interrupted and
            # releases its lease so another worker takes over at once.
            watcher.cancel()
            scheduler.cancel()  # a firing in flight rolls back whole
            sender.cancel()
            self._abort_all("shutdown")
            await asyncio.gather(watcher, scheduler, sender, *self.tasks, return_exceptions=True)
            await asyncio.gather(*(server.stop() for server in self.mcp_servers))
            heartbeat.stop()
            await asyncio.to_thread(heartbeat.join, 10)
            if self.context.budgets is not None:
                await self.context.budgets.stop()
            await self.context.providers.aclose()
            await self.context.deltas.close()
            await self.delta_db.close()
            log.info("worker %s stopped", self.id)

    async def _connect_mcp_servers(self) -> None:
        """Start every MCP server and give them FERRYMAN_MCP_CONNECT_TIMEOUT to list their
        tools before the first claim; one that is not up by then joins when it is."""
        for server in self.mcp_servers:
            server.start()
        timeout = self.settings.mcp_connect_timeout
        connected = await asyncio.gather(
            *(server.wait_connected(timeout) for server in self.mcp_servers)
        )
        for server, up in zip(self.mcp_servers, connected, strict=True):
            if up:
                continue
            if server.last_error is not None:
                log.warning(
                    "MCP server %s failed to start (%s); it is tried again with backoff, and"
                    " its tools come when it is up",
                    server.name,
                    server.last_error,
                )
            else:
                log.warning(
                    "MCP server %s is not up after %g s; its tools come when it is",
                    server.name,
                    timeout,
                )

    def _on_mcp_tools(self, server: McpServer) -> None:
        self.context.registry.replace_source(server.source, server.tools)
        if self.loop is not None and not self.stopping.is_set():
            task = asyncio.ensure_future(self._publish_tools())
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _publish_tools(self) -> None:
        """Publish the tools this worker offers, for GET /api/tools and the names a session
        may use."""
        entries = [tool.catalog_entry() for tool in self.context.registry.tools()]
        try:
            async with self.db.transaction() as conn:
                await tool_store.publish_worker_tools(conn, self.id, entries)
        except UNAVAILABLE_ERRORS as exc:
            log.warning("tool catalog not published, database unavailable: %s", exc)

    async def _claim(self, limit: int) -> list[Run]:
        """Claim up to `limit` sessions in one statement. Only when that finds fewer are dead
        workers looked for (their sessions become claimable): each worker's death watch
        reaps its peer at once, so this is the fallback, and it costs no claim a round trip."""
        try:
            async with self.db.connection() as conn:
                rows = await self._claim_rows(conn, limit)
                if len(rows) < limit and await liveness.reap_and_wake(conn):
                    rows += await self._claim_rows(conn, limit - len(rows))
            self.claims.recovered()
            claimed = []
            for row in rows:
                if await self._settle_unrunnable(row):
                    self.work.set()  # settled without running: look for more work at once
                else:
                    claimed.append(row)
        except UNAVAILABLE_ERRORS as exc:
            self.claims.failed(exc)
            await asyncio.sleep(1)
            return []
        started = [Run(self.context, row) for row in claimed]
        for run in started:
            self.runs[run.session_id] = run
        return started

    async def _claim_rows(self, conn: Connection, limit: int) -> list[dict[str, Any]]:
        return await claim_store.claim(
            conn,
            self.id,
            self.context.pid,
            self.settings.lease_ttl,
            list(self.runs),
            limit,
            tools=self.context.registry.names(),
            max_running=self.settings.owner_max_running,
        )

    async def _settle_unrunnable(self, row: dict[str, Any]) -> bool:
        """Settle a claimed session that must not run: its last FERRYMAN_MAX_ATTEMPTS runs all
        ended without finishing (each taken over after a crash, a lost lease or a shutdown;
        follow-ups and approvals start runs after one that finished, so they never count), or
        it was cancelled (or deleted) while no worker held it. True when it was settled."""
        fence = Fence(self.id, row["attempt"])
        # `claims` counts this claim too: the runs before it that did not finish are one less.
        unfinished = row["claims"] - 1
        if unfinished >= self.settings.max_attempts:
            status = Status.FAILED
            error: dict[str, Any] | None = {
                "code": SessionErrorCode.MAX_ATTEMPTS_EXCEEDED,
                "message": f"its last {unfinished} runs ended without finishing (a crash, a lost"
                f" lease or a shutdown each time; FERRYMAN_MAX_ATTEMPTS="
                f"{self.settings.max_attempts})",
            }
        elif row["cancel_requested_at"] is not None or row["deleted_at"] is not None:
            status, error = Status.CANCELLED, None  # no model call for it
        else:
            return False
        with fence_errors():
            async with self.db.pipeline() as conn:
                await settling.finish(
                    conn, fence, row, status, Batch(), error=error, requeue_undelivered=False
                )
        return True

    async def _drive(self, run: Run) -> None:
        def on_cancel(_: str | None) -> None:
            check = asyncio.ensure_future(self._check_cancel(run))
            self.tasks.add(check)
            check.add_done_callback(self.tasks.discard)

        def on_inbox(_: str | None) -> None:
            run.inbox = True

        try:
            # A cancel that came between the claim and these subscriptions: the run's first
            # transaction reads it.
            with (
                self.bus.subscribe(cancel_key(run.session_id), on_cancel),
                self.bus.subscribe(inbox_key(run.session_id), on_inbox),
                tracing.invoke_agent(run.row),
            ):
                await run.execute()
        except UNAVAILABLE_ERRORS as exc:
            # The database went away mid-run: the run stops here. Its lease runs out (or the
            # heartbeat gives it up) and a claim resumes the session from its log once the
            # database is back. Expected in an outage, so no traceback.
            log.warning(
                "run stopped: the database is unavailable (%s)",
                type(exc).__name__,
                extra={"session": str(run.session_id)},
            )
        except Exception:
            log.exception("run failed unexpectedly", extra={"session": str(run.session_id)})
        finally:
            self.runs.pop(run.session_id, None)
            self.slot_freed.set()

    async def _check_cancel(self, run: Run) -> None:
        with contextlib.suppress(*UNAVAILABLE_ERRORS):
            async with self.db.connection() as conn:
                if await settling.cancel_requested(conn, run.session_id):
                    run.abort("cancelled")
