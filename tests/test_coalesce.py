"""app.coalesce: what many tasks ask while a query is in flight goes out together, at most
`concurrency` queries at a time, each key once; a failure reaches only the callers of its
batch, and a caller that leaves takes no one else with it. Then the session streams' batched
read of the log, on a real database."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from app.coalesce import Coalescer
from app.store.events import append_session_event, read_session_events, read_session_pages
from app.store.sessions import NewSession, create_session, soft_delete
from tests.support import database_with_worker


class Lookups:
    """A fetch that answers `key * 10` once released, and records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        self.fail = False

    async def __call__(self, keys: list[int]) -> dict[int, int]:
        self.calls.append(keys)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
            if self.fail:
                raise RuntimeError("the database is away")
            return {key: key * 10 for key in keys}
        finally:
            self.in_flight -= 1


async def test_what_is_asked_during_a_fetch_goes_out_together() -> None:
    fetch = Lookups()
    coalescer = Coalescer(fetch, max_keys=100, concurrency=1)
    first = asyncio.create_task(coalescer.get(1))
    await asyncio.sleep(0)  # the first fetch is in flight
    await asyncio.sleep(0)
    rest = [asyncio.create_task(coalescer.get(key)) for key in [2, 3, 3, 4]]
    await asyncio.sleep(0)
    fetch.release.set()
    assert await first == 10
    assert await asyncio.gather(*rest) == [20, 30, 30, 40]
    assert fetch.calls == [[1], [2, 3, 4]]  # each key once


async def test_at_most_concurrency_fetches_and_max_keys_each() -> None:
    fetch = Lookups()
    coalescer = Coalescer(fetch, max_keys=3, concurrency=2)
    gets = [asyncio.create_task(coalescer.get(key)) for key in range(10)]
    await asyncio.sleep(0.01)
    assert fetch.most_in_flight == 2
    fetch.release.set()
    assert await asyncio.gather(*gets) == [key * 10 for key in range(10)]
    assert fetch.most_in_flight == 2
    assert all(len(keys) <= 3 for keys in fetch.calls)
    assert sorted(key for keys in fetch.calls for key in keys) == list(range(10))


async def test_a_failure_reaches_its_batch_and_the_next_one_works() -> None:
    fetch = Lookups()
    coalescer = Coalescer(fetch, concurrency=1)
    fetch.fail = True
    fetch.release.set()
    with pytest.raises(RuntimeError, match="away"):
        await coalescer.get(1)
    fetch.fail = False
    assert await coalescer.get(2) == 20


async def test_a_key_the_fetch_does_not_answer_fails_its_caller_alone() -> None:
    async def partial(keys: list[int]) -> dict[int, int]:
        return {key: key for key in keys if key != 13}

    coalescer = Coalescer(partial)
    results = await asyncio.gather(coalescer.get(13), coalescer.get(1), return_exceptions=True)
    assert isinstance(results[0], LookupError) and results[1] == 1


async def test_a_caller_that_leaves_cancels_only_itself() -> None:
    fetch = Lookups()
    coalescer = Coalescer(fetch, concurrency=1)
    leaving = asyncio.create_task(coalescer.get(1))
    staying = asyncio.create_task(coalescer.get(1))
    await asyncio.sleep(0.01)
    leaving.cancel()
    fetch.release.set()
    assert await staying == 10
    with pytest.raises(asyncio.CancelledError):
        await leaving


# --- the session streams' batched read -------------------------------------------------------


async def test_pages_of_several_sessions_read_as_one_session_at_a_time() -> None:
    async with database_with_worker("ferryman_coalesce", "coalesce-worker") as db:
        owner = f"coalesce-{uuid.uuid4().hex[:8]}"
        async with db.transaction() as conn:
            busy, quiet, gone = [
                (
                    await create_session(
                        conn, owner, NewSession(t, t, "scripted", None, None, {}), None
                    )
                )[0]["id"]
                for t in ("busy", "quiet", "gone")
            ]
            for n in range(5):
                await append_session_event(conn, busy, "tool_result", {"n": n, "pad": "x" * 300})
            await soft_delete(conn, owner, gone)
        wants = [(busy, 1, 10_000), (busy, 2, 500), (quiet, 1, 10_000), (gone, 0, 10_000)]
        wants.append((uuid.uuid4(), 0, 10_000))  # never existed
        async with db.connection() as conn:
            pages = await read_session_pages(conn, wants, limit=3)
            for session_id, after, max_bytes in wants[:2]:
                rows, deleted, after_epoch = pages[(session_id, after, max_bytes)]
                alone = await read_session_events(conn, session_id, after, 3, max_bytes)
                assert rows and [r["seq"] for r in rows] == [r["seq"] for r in alone]
                assert set(alone[0]) <= set(rows[0]) and not deleted
                assert after_epoch == 0  # the epoch of the event at the cursor
        assert pages[wants[2]] == ([], False, 0)  # nothing new, still there
        assert pages[wants[3]][1] is True  # deleted
        assert pages[wants[4]] == ([], True, None)  # no such session


async def test_a_get_as_a_drain_ends_is_still_answered() -> None:
    """A drain that found nothing waiting has left before its task's done callbacks run: a get
    in between (from a caller its last answer woke) must start a new one."""
    fetch = Lookups()
    fetch.release.set()
    coalescer = Coalescer(fetch, concurrency=1)

    async def one_after_another() -> list[int]:
        return [await coalescer.get(key) for key in range(5)]

    assert await asyncio.wait_for(one_after_another(), 1) == [0, 10, 20, 30, 40]
