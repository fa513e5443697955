"""`OwnerSessionClient`: a live, correct picture of one owner's sessions.

It takes a list snapshot (every page), then follows the owner stream from the snapshot's
cursor, reconnecting with `Last-Event-ID` after a jittered backoff. It takes a new snapshot
at once on `resync_required` or on an event about a session it does not know, and every
`reconcile_interval` seconds to heal whatever events cannot say (lease, usage, `lastSeq`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from ferryman._core import MAX_LIST_LIMIT
from ferryman.errors import ApiError, FerrymanConnectionError, NotFoundError
from ferryman.models import Session, StreamEvent
from ferryman.sdk import AsyncFerryman

Picture = dict[str, Session]


def _status(data: dict[str, Any]) -> dict[str, Any]:
    change = {"status": data.get("status"), "error": data.get("error")}
    if isinstance(data.get("attempt"), int):
        change["attempt"] = data["attempt"]
    return change


# What an owner event changes, as field values.
_LOCAL_UPDATES: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "session_title": lambda data: {"title": str(data.get("title", ""))},
    "session_active_stage": lambda data: {"active_stage": data.get("stage")},
    "session_cancel_requested": lambda data: {"cancel_requested": True},
    "session_status": _status,
}
# After these, fields that no event carries (lease, usage, lastSeq, updatedAt) changed too: the
# session is fetched again, as after an event not above (`session_resumed`, a newer type).
_REFETCH = frozenset({"session_status"})


class OwnerSessionClient:
    """`sessions` by id, always as the server has them (give or take the latest events);
    `connected` is False while the stream reconnects. Use as `async with`, then watch
    `changes()` or pass `on_change`."""

    def __init__(
        self,
        client: AsyncFerryman,
        *,
        reconcile_interval: float = 60.0,
        on_change: Callable[[OwnerSessionClient], None] | None = None,
    ) -> None:
        self.client = client
        self.reconcile_interval = reconcile_interval
        self.on_change = on_change
        self.sessions: Picture = {}
        self.connected = False
        self.last_event_id: str | None = None  # the last owner event applied
        self.snapshots = 0  # list snapshots taken, the first one included
        self._gone: set[str] = set()  # deleted since the snapshot: their late events are moot
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def __aenter__(self) -> OwnerSessionClient:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Take the first snapshot (its errors are raised here), then follow in a task."""
        cursor = await self._snapshot()
        self._task = asyncio.create_task(self._follow_forever(cursor))

    async def run(self) -> None:
        """Keep the picture current in this task, until cancelled or a fatal error."""
        await self._follow_forever(await self._snapshot())

    async def close(self) -> None:
        """Stop following. An error that stopped it already is `error` (and `changes()`'s)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    @property
    def error(self) -> BaseException | None:
        """What stopped the picture (a revoked key, say), if anything did."""
        return self._error

    async def changes(self) -> AsyncIterator[Picture]:
        """The picture now, then after each change (changes that come together are yielded
        once). Raises what stopped the picture (a revoked key, say)."""
        while True:
            changed = self._changed
            if self._error is not None:
                raise self._error
            yield dict(self.sessions)
            await changed.wait()

    async def wait_until(
        self, predicate: Callable[[Picture], bool], timeout: float | None = None
    ) -> Picture:
        """The first picture, this one included, for which `predicate` holds."""
        async with asyncio.timeout(timeout):
            async for picture in self.changes():
                if predicate(picture):
                    return picture
        raise AssertionError("unreachable")

    # --- the loop ------------------------------------------------------------------------------

    async def _follow_forever(self, cursor: str) -> None:
        try:
            while True:
                await self._follow(cursor)
                cursor = await self._reconcile()
        except Exception as exc:  # not retryable (a revoked key): the picture stops here
            self._error = exc
            self._notify()
            raise

    async def _follow(self, cursor: str) -> None:
        """Apply the owner stream from `cursor`; return when a new snapshot is due."""
        stream = self.client._owner_stream(cursor, "end", self._on_connection)
        with contextlib.suppress(TimeoutError):
            async with (
                asyncio.timeout(self.reconcile_interval),
                contextlib.aclosing(self.client._events(stream)) as events,
            ):
                async for event in events:
                    if not await self._apply(event):
                        return

    async def _reconcile(self) -> str:
        """A new snapshot, retried until the server answers; its cursor."""
        backoff = self.client._backoff()
        while True:
            try:
                return await self._snapshot()
            except (FerrymanConnectionError, ApiError) as exc:
                if isinstance(exc, ApiError) and not exc.retryable:
                    raise
                self._set_connected(False)
            await asyncio.sleep(backoff.next())

    async def _snapshot(self) -> str:
        """Every page of the list. Streaming from the first page's cursor misses nothing: a
        later page is newer, and the events it already shows set the same values again."""
        sessions: Picture = {}
        cursor: str | None = None
        token: str | None = None
        while True:
            page = await self.client.list_sessions(limit=MAX_LIST_LIMIT, page_token=token)
            cursor = cursor or page.cursor
            sessions.update((s.id, s) for s in page.sessions)
            token = page.next_page_token
            if token is None:
                break
        self.sessions, self.last_event_id = sessions, cursor
        self._gone.clear()
        self.snapshots += 1
        self._notify()
        return cursor

    # --- events ------------------------------------------------------------------------------

    async def _apply(self, event: StreamEvent) -> bool:
        """Fold one frame in; False when a new snapshot must be taken first."""
        if event.type == "caught_up":
            self._set_connected(True)
            return True
        if event.type == "resync_required":
            return False
        if event.id is None or not self._first_time(event.id):
            return True
        self.last_event_id = event.id
        session_id = event.session_id or ""
        if event.type == "session_created":
            self.sessions[session_id] = Session.model_validate(event.data["session"])
            self._gone.discard(session_id)
        elif event.type == "session_deleted":
            self._forget(session_id)
        elif session_id in self._gone:
            return True  # a late event about a session deleted since
        elif session_id not in self.sessions or not await self._update(session_id, event):
            return False  # one the snapshot does not know, or one that could not be fetched
        self._notify()
        return True

    def _first_time(self, event_id: str) -> bool:
        return self.last_event_id is None or int(event_id) > int(self.last_event_id)

    async def _update(self, session_id: str, event: StreamEvent) -> bool:
        update = _LOCAL_UPDATES.get(event.type)
        if update is not None:
            session = self.sessions[session_id]
            self.sessions[session_id] = session.model_copy(update=update(event.data))
        if update is not None and event.type not in _REFETCH:
            return True
        return await self._refetch(session_id)

    async def _refetch(self, session_id: str) -> bool:
        """The session as it is now; False when the server cannot say (take a snapshot)."""
        try:
            self.sessions[session_id] = await self.client.get_session(session_id)
        except NotFoundError:
            self._forget(session_id)
        except FerrymanConnectionError:
            return False
        except ApiError as exc:
            if not exc.retryable:
                raise
            return False
        return True

    def _forget(self, session_id: str) -> None:
        self.sessions.pop(session_id, None)
        self._gone.add(session_id)

    def _on_connection(self, connected: bool) -> None:
        # Connected only counts once the backlog is in (`caught_up`); a loss counts at once.
        if not connected:
            self._set_connected(False)

    def _set_connected(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        if self.on_change is not None:
            self.on_change(self)
