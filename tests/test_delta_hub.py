"""DeltaHub's chunks, without a database (its statement recorded): each flush of a session is
the next chunk of its afterSeq, numbering starts again at a new afterSeq, a turn stores at most
MAX_STORED_CHUNKS_PER_TURN of them, and the turn's last piece (`take`) keeps its number."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from app.runtime import deltas
from app.store.deltas import Chunk
from app.store.notify import parse_ephemeral


class FakeDatabase:
    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[None]:
        yield None


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[tuple[str, str]], list[Chunk]]]:
    calls: list[tuple[list[tuple[str, str]], list[Chunk]]] = []

    async def publish(_: Any, frames: Any, chunks: Any, ts: Any, *, sweep: bool = False) -> None:
        calls.append((frames, chunks))

    monkeypatch.setattr(deltas, "publish_deltas", publish)
    monkeypatch.setattr(deltas, "MAX_STORED_CHUNKS_PER_TURN", 3)
    return calls


async def test_chunks_are_numbered_per_after_seq_and_bounded(sent: list[Any]) -> None:
    hub = deltas.DeltaHub(FakeDatabase(), 60.0)  # type: ignore[arg-type]
    sid = uuid.uuid4()
    for i in range(5):
        hub.add(sid, "owner", f"t{i}", 4)
        await hub.flush()
    hub.add(sid, "owner", "after a retry", 9)
    await hub.flush()
    hub.add(sid, "owner", "last", 9)
    line = await hub.take(sid)
    await hub.close()
    places = [parse_ephemeral(body)[:2] for frames, _ in sent for _, body in frames]  # type: ignore[index]
    assert places == [(4, 1), (4, 2), (4, 3), (4, 4), (4, 5), (9, 1)]
    stored = [(c.after_seq, c.chunk, c.text) for _, chunks in sent for c in chunks]
    assert stored == [(4, 1, "t0"), (4, 2, "t1"), (4, 3, "t2"), (9, 1, "after a retry")]
    assert line is not None and parse_ephemeral(line[1])[:2] == (9, 2)  # type: ignore[index]
