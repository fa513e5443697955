"""OwnerSessionClient (ferryman/live.py) against real servers: its picture of an owner's
sessions ends equal to the server's through a proxy that cuts the stream every few KB and
drops every connection on cue, across an API server restart, after `resync_required`, after
an event about a session it does not know, and through a worker's run."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import pytest

from ferryman import AsyncFerryman, AuthenticationError, OwnerSessionClient, Session
from ferryman.live import Picture
from tests.support import ServerProcess, WorkerProcess, create_owner_key, query, running

FAST = {"reconnect_delay": 0.02, "max_reconnect_delay": 0.3}


class Proxy:
    """A TCP proxy to a local server. It closes a stream's connection (an owner stream's, or
    one whose request names another of `streams`) once `cut_after` bytes of the answer went
    through, drops every connection at once on `drop()`, and refuses connections while
    `down`. It records each such stream's request head."""

    def __init__(
        self,
        target_port: int,
        cut_after: int | None = None,
        streams: tuple[bytes, ...] = (b"/owner-events",),
    ) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.streams = streams
        self.down = False
        self.heads: list[bytes] = []
        self.cuts = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        self.drop()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(self) -> None:
        for writer in list(self._open):
            writer.transport.abort()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.down:
            client_w.transport.abort()
            return
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_w.transport.abort()
            return
        self._open.update((client_w, server_w))
        limit: dict[str, int | None] = {"left": None}
        pipes = [
            asyncio.create_task(self._up(client_r, server_w, limit)),
            asyncio.create_task(self._down(server_r, client_w, limit)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            for writer in (client_w, server_w):
                self._open.discard(writer)
                writer.transport.abort()

    async def _up(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: dict[str, Any]
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                if any(stream in chunk for stream in self.streams):
                    self.heads.append(chunk)
                    limit["left"] = self.cut_after
                writer.write(chunk)
                await writer.drain()

    async def _down(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: dict[str, Any]
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := await reader.read(65536):
                left = limit["left"]
                if left is not None and len(chunk) >= left:
                    # The first `left` bytes, then a close mid-answer.
                    writer.write(chunk[:left])
                    await writer.drain()
                    writer.close()
                    self.cuts += 1
                    return
                if left is not None:
                    limit["left"] = left - len(chunk)
                writer.write(chunk)
                await writer.drain()


def view(picture: Picture) -> dict[str, tuple[Any, ...]]:
    """What the owner events keep current, by session."""
    return {
        sid: (s.title, s.status, s.attempt, s.cancel_requested, s.active_stage, s.error)
        for sid, s in picture.items()
    }


async def truth(ferryman: AsyncFerryman) -> dict[str, tuple[Any, ...]]:
    return view({s.id: s async for s in ferryman.iter_sessions()})


async def settle(watcher: OwnerSessionClient, writer: AsyncFerryman, timeout: float = 20) -> None:
    """Wait until the picture is the server's (the server's, read again at each change)."""
    expected = await truth(writer)
    async with asyncio.timeout(timeout):
        async for picture in watcher.changes():
            # Checked against a new reading too: the first may predate events still coming.
            if view(picture) == expected and view(picture) == (expected := await truth(writer)):
                return


def increasing(ids: list[int]) -> bool:
    return all(a <= b for a, b in itertools.pairwise(ids))


# --- through a proxy --------------------------------------------------------------------------


async def test_picture_through_a_proxy_that_cuts_and_drops(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    cursors: list[int] = []
    async with (
        Proxy(server.port, cut_after=2000) as proxy,
        AsyncFerryman(server.url, api_key=key) as writer,
        AsyncFerryman(proxy.url, api_key=key, **FAST) as reader,
    ):
        early = [await writer.create_session(f"early {i}") for i in range(3)]

        def record(watcher: OwnerSessionClient) -> None:
            cursors.append(int(watcher.last_event_id or 0))

        async with OwnerSessionClient(reader, on_change=record) as watcher:
            assert set(watcher.sessions) == {s.id for s in early}
            made: list[Session] = []
            for i in range(12):
                made.append(await writer.create_session(f"session {i}", title=f"t{i}"))
                if i % 3 == 0:
                    await writer.rename_session(made[i].id, f"renamed {i}")
                if i % 4 == 1:
                    await writer.cancel_session(made[i].id)
                if i % 5 == 2:
                    await writer.delete_session(made[i - 1].id)
                if i % 4 == 3:
                    proxy.drop()
                await asyncio.sleep(0.05)
            await writer.delete_session(early[0].id)
            await settle(watcher, writer)
            assert watcher.connected
    assert proxy.cuts > 0, "the stream was never cut"
    assert any(b"last-event-id:" in head.lower() for head in proxy.heads)
    # Applied once each: the last applied id never goes back.
    assert increasing(cursors), cursors


async def test_resync_required_takes_a_new_snapshot(database_url: str) -> None:
    """Away for longer than the replay limit: the reconnect is answered `resync_required`,
    and the picture is rebuilt from a new snapshot."""
    _, key = create_owner_key(database_url)
    env = {"FERRYMAN_REPLAY_LIMIT": "3"}
    with running(ServerProcess(database_url, env=env)) as api:
        async with (
            Proxy(api.port) as proxy,
            AsyncFerryman(api.url, api_key=key) as writer,
            AsyncFerryman(proxy.url, api_key=key, **FAST) as reader,
            OwnerSessionClient(reader) as watcher,
        ):
            first = await writer.create_session("before")
            await watcher.wait_until(lambda p: first.id in p, 10)
            proxy.down = True
            proxy.drop()
            await watcher.wait_until(lambda _: not watcher.connected, 10)
            for i in range(5):
                made = await writer.create_session(f"while away {i}")
                await writer.rename_session(made.id, f"away {i}")
            await writer.cancel_session(first.id)
            assert watcher.snapshots == 1
            proxy.down = False
            await settle(watcher, writer)
            await watcher.wait_until(lambda _: watcher.connected, 10)
            assert watcher.snapshots == 2
            assert len(proxy.heads) >= 2


# --- across a restart -------------------------------------------------------------------------


async def test_picture_survives_a_server_restart(database_url: str) -> None:
    """The watched server stops; writes go on through a second one on the same database; a
    new server comes up on the first one's port and the picture catches up."""
    _, key = create_owner_key(database_url)
    watched = ServerProcess(database_url).start()
    try:
        with running(ServerProcess(database_url)) as other:
            async with (
                AsyncFerryman(other.url, api_key=key) as writer,
                AsyncFerryman(watched.url, api_key=key, **FAST) as reader,
                OwnerSessionClient(reader) as watcher,
            ):
                a = await writer.create_session("a")
                b = await writer.create_session("b")
                await settle(watcher, writer)
                watched.stop()
                await watcher.wait_until(lambda _: not watcher.connected, 10)
                await writer.rename_session(a.id, "a, renamed")
                await writer.cancel_session(b.id)
                c = await writer.create_session("c")
                await writer.delete_session(a.id)
                watched = ServerProcess(database_url, port=watched.port).start()
                await settle(watcher, writer)
                await watcher.wait_until(lambda _: watcher.connected, 10)
                assert set(watcher.sessions) == {b.id, c.id}
                assert watcher.sessions[b.id].status == "cancelled"
                assert watcher.snapshots == 1, "caught up by Last-Event-ID, not a new snapshot"
    finally:
        watched.stop()


# --- reconciliation ---------------------------------------------------------------------------


async def test_an_unknown_session_takes_a_new_snapshot(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    _, key = owner_key
    async with (
        AsyncFerryman(server.url, api_key=key) as writer,
        AsyncFerryman(server.url, api_key=key, **FAST) as reader,
    ):
        missed = await writer.create_session("missed")
        async with OwnerSessionClient(reader) as watcher:
            await watcher.wait_until(lambda _: watcher.connected, 10)
            del watcher.sessions[missed.id]  # as if the snapshot had missed it
            await writer.rename_session(missed.id, "seen again")
            picture = await watcher.wait_until(lambda p: missed.id in p, 10)
            assert picture[missed.id].title == "seen again"
            assert watcher.snapshots == 2


async def test_a_periodic_snapshot_heals_what_events_do_not_say(
    server: ServerProcess, owner_key: tuple[str, str]
) -> None:
    """A message to a queued session moves its lastSeq with no owner event: the next
    periodic snapshot brings it in, and the picture stays connected meanwhile."""
    _, key = owner_key
    async with (
        AsyncFerryman(server.url, api_key=key) as writer,
        AsyncFerryman(server.url, api_key=key, **FAST) as reader,
    ):
        session = await writer.create_session("queued")
        async with OwnerSessionClient(reader, reconcile_interval=0.5) as watcher:
            await watcher.wait_until(lambda _: watcher.connected, 10)
            await writer.send_message(session.id, "more")
            await watcher.wait_until(lambda p: p[session.id].last_seq == 2, 10)
            assert watcher.connected and watcher.snapshots >= 2


async def test_a_run_as_the_server_has_it(
    api: ServerProcess, key: str, shared_worker: WorkerProcess
) -> None:
    """Status events from a worker's run: once it ended, the picture's session is exactly the
    server's (fetched again after each status change: lease, usage, lastSeq)."""
    async with (
        AsyncFerryman(api.url, api_key=key) as writer,
        AsyncFerryman(api.url, api_key=key, **FAST) as reader,
        OwnerSessionClient(reader) as watcher,
    ):
        session = await writer.create_session("run", script=[{"text": "hi"}])
        picture = await watcher.wait_until(
            lambda p: session.id in p and p[session.id].status == "succeeded", 30
        )
        assert picture[session.id] == await writer.get_session(session.id)
        assert picture[session.id].attempt == 1 and picture[session.id].lease is None


async def test_a_revoked_key_stops_the_picture(database_url: str) -> None:
    """A 401 is not retried: `changes()` raises it."""
    owner, key = create_owner_key(database_url)
    with running(ServerProcess(database_url)) as api:
        async with (
            AsyncFerryman(api.url, api_key=key, **FAST) as reader,
            OwnerSessionClient(reader, reconcile_interval=0.3) as watcher,
        ):
            await query(
                database_url,
                "UPDATE api_keys SET revoked_at = clock_timestamp() WHERE owner_id = %s",
                (owner,),
            )
            with pytest.raises(AuthenticationError, match="401 INVALID_API_KEY"):
                await watcher.wait_until(lambda _: False, 15)
            assert isinstance(watcher.error, AuthenticationError)
