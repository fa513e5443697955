"""Token chunks resume too: a client that reconnects mid-turn with `Last-Event-ID` gets exactly
the chunks it missed, from any API process (two on one database here), then the turn's message;
a real worker streams a scripted turn slowly enough that every flush is a chunk of its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ferryman import AsyncFerryman, SessionFold
from tests.support import (
    ServerProcess,
    WorkerProcess,
    client,
    new_session,
    query,
    ready,
    running,
    sse,
    wait_for_status,
)

WORDS = [f"w{i:02d} " for i in range(60)]
TEXT = "".join(WORDS)
# 60 pieces over 6 s: one a tenth of a second, so each flush of the worker is about one piece.
SLOW_TURN = [{"text": TEXT, "chunks": len(WORDS), "delayMs": 6000}]


@pytest.fixture(scope="module")
def other_api(isolated_db: str) -> Iterator[ServerProcess]:
    """A second API process on the module's database."""
    with running(ServerProcess(isolated_db, env={"FERRYMAN_POLL_INTERVAL": "1"})) as proc:
        yield proc


@dataclass
class Delta:
    id: str
    after: int
    chunk: int
    text: str
    phase: str


def delta_of(event: Any) -> Delta:
    envelope = json.loads(event.data)
    assert event.id == f"{envelope['afterSeq']}.{envelope['chunk']}", event.id
    return Delta(
        event.id,
        envelope["afterSeq"],
        envelope["chunk"],
        envelope["data"]["text"],
        envelope["phase"],
    )


@dataclass
class Read:
    """What a client read of a session stream: its deltas, the durable events' types, the
    `assistant_message`'s text if it came, and the last id it saw (its Last-Event-ID)."""

    deltas: list[Delta]
    types: list[str]
    message: str | None
    last_id: str | None
    caught_up_at: int | None = None  # deltas before `caught_up`


async def read(
    http: httpx.AsyncClient,
    sid: str,
    *,
    last_event_id: str | None = None,
    deltas: int | None = None,
    **params: Any,
) -> Read:
    """Read until `deltas` deltas came (then leave), or the assistant_message, or the end."""
    got = Read([], [], None, last_event_id)
    async with sse(http, f"/api/agent/{sid}/events", last_event_id=last_event_id, **params) as es:
        async for event in es:
            if event.event == "caught_up":
                got.caught_up_at = len(got.deltas)
                continue
            got.last_id = event.id or got.last_id
            if event.event == "message_delta":
                got.deltas.append(delta_of(event))
                if deltas is not None and len(got.deltas) >= deltas:
                    break
                continue
            got.types.append(event.event)
            if event.event == "assistant_message":
                got.message = json.loads(event.data)["data"]["text"]
                break
    return got


def numbers(deltas: list[Delta]) -> list[int]:
    return [d.chunk for d in deltas]


async def test_a_reconnect_mid_turn_to_another_process_gets_exactly_the_missed_chunks(
    api: ServerProcess, other_api: ServerProcess, shared_worker: WorkerProcess, key: str
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as first, client(other_api.url, key) as second:
        sid = await new_session(first, "go", script=SLOW_TURN)
        before = await read(first, sid, deltas=12)
        assert before.last_id is not None and "." in before.last_id
        await asyncio.sleep(1.0)  # the turn streams on while the client is away
        after = await read(second, sid, last_event_id=before.last_id)
        await wait_for_status(first, sid, {"succeeded"})
    assert after.message == TEXT
    assert "assistant_message" not in before.types
    seen = before.deltas + after.deltas
    assert len({d.after for d in seen}) == 1, [d.id for d in seen]
    assert numbers(seen) == list(range(1, len(seen) + 1))  # no gap, no repeat
    assert "".join(d.text for d in seen) == TEXT
    # Some came from the store (before caught_up), the rest live.
    assert after.caught_up_at is not None and after.caught_up_at >= 1
    assert {d.phase for d in after.deltas[: after.caught_up_at]} == {"backlog"}
    assert {d.phase for d in after.deltas[after.caught_up_at :]} <= {"live"}


async def test_a_reconnect_at_an_event_mid_turn_gets_every_chunk_so_far(
    api: ServerProcess, other_api: ServerProcess, shared_worker: WorkerProcess, key: str
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as first, client(other_api.url, key) as second:
        sid = await new_session(first, "go", script=SLOW_TURN)
        before = await read(first, sid, deltas=8)
        at_event = str(before.deltas[0].after)  # the event the turn follows, no fraction
        again = await read(second, sid, last_event_id=at_event)
        await wait_for_status(first, sid, {"succeeded"})
    assert again.message == TEXT
    assert numbers(again.deltas) == list(range(1, len(again.deltas) + 1))
    assert "".join(d.text for d in again.deltas) == TEXT
    assert again.caught_up_at is not None and again.caught_up_at >= 8


async def test_follow_false_mid_turn_sends_the_stored_chunks_before_caught_up(
    api: ServerProcess, shared_worker: WorkerProcess, key: str, isolated_db: str
) -> None:
    await ready(shared_worker)
    async with client(api.url, key) as http:
        sid = await new_session(http, "go", script=SLOW_TURN)
        before = await read(http, sid, deltas=5)
        await asyncio.sleep(0.5)
        snapshot = await read(http, sid, last_event_id=before.last_id, follow="false")
        await wait_for_status(http, sid, {"succeeded"})
        settled = await read(http, sid, last_event_id=before.last_id, follow="false")
    assert snapshot.caught_up_at == len(snapshot.deltas) >= 1
    assert numbers(snapshot.deltas)[0] == before.deltas[-1].chunk + 1
    # Once the turn's message is logged, its chunks are never replayed: the message has them.
    assert settled.deltas == [] and settled.message == TEXT
    # ... and they go from the table when the session's next turn streams, or with the sweep.
    rows = await query(
        isolated_db, "SELECT count(*) AS n FROM session_deltas WHERE session_id = %s", (sid,)
    )
    assert rows[0]["n"] >= 1


async def test_a_cursor_with_a_bad_chunk_is_a_client_error(api: ServerProcess, key: str) -> None:
    async with client(api.url, key) as http:
        sid = await new_session(http, "x")
        for bad in ("1.x", "1.", "1.-2", "1.99999999999", ".3", "1.2.3"):
            response = await http.get(f"/api/agent/{sid}/events", headers={"Last-Event-ID": bad})
            assert response.status_code == 400, (bad, response.text)
            assert response.json()["code"] == "INVALID_CURSOR"
        owner = await http.get("/api/agent/owner-events", headers={"Last-Event-ID": "1.2"})
        assert owner.status_code == 400


async def test_the_sdk_resumes_a_turn_from_a_deltas_id_on_another_process(
    api: ServerProcess, other_api: ServerProcess, shared_worker: WorkerProcess, key: str
) -> None:
    await ready(shared_worker)
    fold = SessionFold()
    async with AsyncFerryman(api.url, api_key=key) as first:
        session = await first.create_session("go", script=SLOW_TURN)
        seen = 0
        last: str | None = None
        async for event in first.session_events(session.id):
            fold.apply(event)
            if event.type == "message_delta":
                seen, last = seen + 1, event.id
                if seen == 6:
                    break
    assert last is not None and "." in last
    draft = fold.draft
    await asyncio.sleep(0.8)
    async with AsyncFerryman(other_api.url, api_key=key) as second:
        async for event in second.session_events(session.id, after=last):
            if event.type == "assistant_message":
                final = event.data["text"]
                break
            fold.apply(event)
    assert fold.draft is not None and draft is not None and len(fold.draft) > len(draft)
    assert fold.draft == final == TEXT
