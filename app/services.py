"""The long-lived parts one process shares: settings, pool, bus, stream feeds."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from app.agent.tools import ToolRegistry, default_registry
from app.bus import Bus
from app.coalesce import Coalescer
from app.config import Settings
from app.creates import SessionCreates
from app.db.pool import Connection, Database, SessionLimits
from app.db.supervisor import EmbeddedSupervisor
from app.store import events as event_store
from app.store import server as server_store
from app.store.events import PageRows, Pages, PageWant
from app.store.notify import STREAMS_CHANNEL
from app.streams.feed import PAGE_ROWS, FeedHub, Heads
from app.streams.sse import StreamSlots
from app.tokens import TokenVerifier

log = logging.getLogger(__name__)

# Allocations between collections of the youngest generation (CPython's default: 700). Every
# SSE frame, row and envelope is a short-lived allocation: at the default, a fan-out of one event
# to 1,000 streams ran a collection every few frames, and every ~10 s a full one of 100-160 ms,
# which every stream felt at once (the owner fan-out's p99 tail).
GC_YOUNG_THRESHOLD = 50_000


def calm_garbage_collector() -> None:
    """Collect less often, and never again scan what start-up built (modules, settings, pools):
    `gc.freeze` moves it out of the collected generations, so a full collection walks only
    what the process made since."""
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)
    gc.freeze()


# One coalesced read of a log (sessions' or owners') takes this many pages at most, and at most
# this many bytes of events (a page is a write's worth, FERRYMAN_STREAM_WRITE_BYTES), so that
# streams reading big backlogs at once hold no more than that per query.
READ_BATCH_PAGES = 500
READ_BATCH_BYTES = 4 * 1_048_576


def database(
    settings: Settings, url: str, *, min_size: int, max_size: int, timeout: float
) -> Database:
    """A pool on `url` with the settings' direct URL and per-connection limits."""
    return Database(
        url,
        direct_url=settings.direct_database_url,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        limits=SessionLimits(
            statement_timeout=settings.db_statement_timeout,
            lock_timeout=settings.db_lock_timeout,
            idle_in_transaction_timeout=settings.db_idle_in_transaction_timeout,
        ),
    )


PagesReader = Callable[[Connection, list[PageWant], int], Awaitable[Pages]]


def _feed_heads(db: Database) -> Heads:
    async def heads(keys: list[str], marker: str | None = None) -> dict[str, tuple[int, bool]]:
        async with db.connection() as conn:
            return await event_store.feed_heads(conn, keys, marker)

    return heads


@dataclass
class Services:
    settings: Settings
    db: Database
    bus: Bus
    hub: FeedHub
    slots: StreamSlots
    shutdown: asyncio.Event = field(default_factory=asyncio.Event)
    # FERRYMAN_AUTH=jwt: what checks the identity provider's tokens (and caches its keys).
    tokens: TokenVerifier | None = None
    # The streams' reads of the logs, and of the session feeds' heads, coalesced
    # (app/coalesce.py).
    session_pages: Coalescer[PageWant, PageRows] = field(init=False)
    owner_pages: Coalescer[PageWant, PageRows] = field(init=False)
    session_heads: Coalescer[str, tuple[int, bool]] = field(init=False)
    # The API's session creates, group-committed (app/creates.py).
    creates: SessionCreates = field(init=False)
    _local_tools: ToolRegistry | None = None
    _supervisor: EmbeddedSupervisor | None = None
    _checks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Each page is at most a write's worth: so many at once hold at most READ_BATCH_BYTES.
        batch = max(1, min(READ_BATCH_PAGES, READ_BATCH_BYTES // self.settings.stream_write_bytes))
        self.session_pages = Coalescer(self._pages(event_store.read_session_pages), max_keys=batch)
        self.owner_pages = Coalescer(self._pages(event_store.read_owner_pages), max_keys=batch)
        self.session_heads = Coalescer(_feed_heads(self.db))
        self.creates = SessionCreates(self.db)

    def _pages(self, read: PagesReader) -> Callable[[list[PageWant]], Awaitable[Pages]]:
        async def pages(wants: list[PageWant]) -> Pages:
            async with self.db.connection() as conn:
                return await read(conn, wants, PAGE_ROWS)

        return pages

    @classmethod
    def create(
        cls,
        settings: Settings,
        database_url: str,
        channels: Collection[str] = (STREAMS_CHANNEL,),
        pool_timeout: float | None = None,
    ) -> Services:
        """The pool on `database_url` (maybe a transaction-mode pooler); the LISTEN connection
        on the direct URL (FERRYMAN_DIRECT_DATABASE_URL, else the same). `channels`: what the
        bus listens on (STREAMS_CHANNEL to serve streams, RUNS_CHANNEL to run a worker);
        `pool_timeout`: the pool's wait for a connection, if not `FERRYMAN_POOL_TIMEOUT`."""
        db = database(
            settings,
            database_url,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            timeout=pool_timeout or settings.pool_timeout,
        )
        bus = Bus(db.direct_url, channels)
        hub = FeedHub(
            bus,
            heads=_feed_heads(db),
            buffer_bytes=settings.feed_buffer_bytes,
            write_bytes=settings.stream_write_bytes,
            poll_interval=settings.poll_interval,
            shortcuts=settings.stream_shortcuts,
            outage_close=settings.stream_outage_close,
        )
        slots = StreamSlots(settings.max_streams_per_owner)
        tokens = TokenVerifier(settings) if settings.auth_mode == "jwt" else None
        return cls(settings=settings, db=db, bus=bus, hub=hub, slots=slots, tokens=tokens)

    def local_tools(self) -> ToolRegistry:
        """The built-in and plug-in tools this process loads (MCP servers' tools come only
        from workers, which hold their connections)."""
        if self._local_tools is None:
            self._local_tools = default_registry(self.settings.tool_module_specs())
        return self._local_tools

    async def start(self) -> None:
        await self.db.open()
        await self.bus.start()
        if self.db.pooled:
            self._checks.add(asyncio.create_task(self._check_autocommit_limits()))
        if not self.settings.database_url:  # the embedded server, as in bootstrap: keep it up
            self._supervisor = EmbeddedSupervisor(
                self.settings.data_dir, self.settings.embedded_check_interval
            )
            self._supervisor.start()

    async def _check_autocommit_limits(self) -> None:
        """Behind a pooler, a statement in autocommit gets no statement_timeout from us (only a
        transaction does, by SET LOCAL): say so once if the server sets none either."""
        if not self.settings.db_statement_timeout:
            return
        try:
            async with self.db.connection() as conn:
                statement_timeout = await server_store.setting(conn, "statement_timeout")
        except Exception as exc:  # the database may not be up yet: nothing to say
            log.debug("statement_timeout check skipped: %s", exc)
            return
        if statement_timeout == "0":
            log.warning(
                "DATABASE_URL goes through a pooler: transactions get FERRYMAN_DB_*_TIMEOUT by "
                "SET LOCAL, but statements in autocommit have no statement_timeout; set one on "
                "the role (ALTER ROLE ... SET statement_timeout = '%gs'), see docs/deploy.md",
                self.settings.db_statement_timeout,
            )

    async def stop(self) -> None:
        for check in self._checks:
            check.cancel()
        await asyncio.gather(*self._checks, return_exceptions=True)
        self.shutdown.set()
        if self._supervisor is not None:
            await self._supervisor.stop()
        await self.bus.stop()
        await self.db.close()
