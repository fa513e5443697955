"""A session feed's token chunks kept for reconnects (app/store/deltas.py), as stream frames."""

from __future__ import annotations

from uuid import UUID

from app.db.pool import Database
from app.store import deltas as delta_store
from app.streams.feed import StoredChunks
from app.streams.frames import Ephemeral, stored_delta


def session_chunks(db: Database, session_id: UUID, owner_id: str) -> StoredChunks:
    """How a session's feed reads its stored chunks: the turn open at a cursor (backlog frames,
    sent before `caught_up`), and a live stream's missed chunks (live frames)."""

    async def open_turn(
        cursor: int, seen_seq: int, seen_chunk: int
    ) -> tuple[int, list[Ephemeral]] | None:
        async with db.connection() as conn:
            turn = await delta_store.open_turn(conn, session_id, cursor, seen_seq, seen_chunk)
        if turn is None:
            return None
        frames = [stored_delta(row, session_id, owner_id, "backlog") for row in turn.chunks]
        return turn.after_seq, frames

    async def between(after_seq: int, first: int, before: int) -> list[Ephemeral]:
        async with db.connection() as conn:
            rows = await delta_store.chunks_after(conn, session_id, after_seq, first - 1, before)
        return [stored_delta(row, session_id, owner_id, "live") for row in rows]

    return StoredChunks(open_turn, between)
