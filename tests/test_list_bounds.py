"""What a list shows a tenant: summaries (no prompt or instructions whole) and answers bounded
in bytes (FERRYMAN_LIST_MAX_BYTES), on the native list and the Agent Protocol's threads search.
The pure parts by property; the rest on a real server in keys mode on a real PostgreSQL.
(bench/list_size.py measures the bytes and the server's memory before and after.)"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import httpx
import psutil
import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain import (
    LIST_ENVELOPE_BYTES,
    json_size,
    session_summary,
    session_view,
    within_bytes,
)
from app.store.sessions import _LIST_SESSIONS, LIST_COLUMNS, SESSION_COLUMNS
from tests.support import ServerProcess, client, create_owner_key, running

EXCERPT = 2000
MAX_BYTES = 65_536
SESSIONS = 10
CHARS = 100_000
EMOJI = [chr(c) for c in range(0x1F600, 0x1F650)]  # 4 bytes each: the worst case per character


@given(st.lists(st.integers(min_value=1, max_value=200_000), max_size=60), st.integers(0, 10**6))
def test_a_page_holds_the_longest_run_of_items_within_the_bound(
    sizes: list[int], max_bytes: int
) -> None:
    kept = within_bytes(sizes, max_bytes)
    used = LIST_ENVELOPE_BYTES + sum(s + 1 for s in sizes[:kept])
    assert kept <= len(sizes)
    if sizes:
        assert kept >= 1  # every page moves on
    if kept > 1:
        assert used <= max_bytes
    if kept < len(sizes):  # stopped only because the next item would pass the bound
        assert used + sizes[kept] + 1 > max_bytes


def row(prompt: str, instructions: str | None) -> dict[str, Any]:
    columns = {c.strip(): None for c in SESSION_COLUMNS.split(",")}
    now = datetime.now(UTC)
    return {
        **columns,
        "id": uuid4(),
        "owner_id": "o",
        "title": "t",
        "status": "queued",
        "attempt": 0,
        "model": "scripted",
        "prompt": prompt,
        "instructions": instructions,
        "last_seq": 1,
        "created_at": now,
        "updated_at": now,
        "metadata": {},
        "model_settings": {},
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "resumes": 0,
    }


@given(st.text(max_size=300), st.none() | st.text(max_size=300), st.integers(1, 250))
def test_a_summary_is_the_view_with_its_big_texts_cut(
    prompt: str, instructions: str | None, chars: int
) -> None:
    r = row(prompt, instructions)
    summary, view = session_summary(r, chars), session_view(r)
    assert summary["prompt"] == prompt[:chars]
    assert summary["instructions"] == (None if instructions is None else instructions[:chars])
    assert summary["truncated"] == [
        name
        for name, text in (("prompt", prompt), ("instructions", instructions))
        if text is not None and len(text) > chars
    ]
    rest = {k: v for k, v in summary.items() if k not in ("prompt", "instructions", "truncated")}
    assert rest == {k: v for k, v in view.items() if k not in ("prompt", "instructions")}


def test_a_list_reads_only_the_start_of_the_big_columns() -> None:
    for name in ("prompt", "instructions"):
        assert re.search(rf"(^|,)\s*{name}\s*(,|$)", LIST_COLUMNS) is None  # never whole
        assert f"left({name}, %(excerpt)s::int + 1) AS {name}" in LIST_COLUMNS
    assert LIST_COLUMNS.count(" AS ") == 2


def wide(rng: random.Random) -> str:
    return "".join(rng.choices(EMOJI, k=CHARS))


@pytest.fixture(scope="module")
def keyed(isolated_db: str) -> Iterator[tuple[ServerProcess, str, list[dict[str, Any]]]]:
    """A keys-mode server with small list bounds and one owner's sessions, each with a prompt
    and instructions of 100,000 four-byte characters."""
    _, key = create_owner_key(isolated_db)
    env = {
        "FERRYMAN_AUTH": "keys",
        "FERRYMAN_LIST_MAX_BYTES": str(MAX_BYTES),
        "FERRYMAN_LIST_EXCERPT_CHARS": str(EXCERPT),
    }
    rng = random.Random(27)
    with running(ServerProcess(isolated_db, env=env)) as server:
        made = []
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as http:
            for i in range(SESSIONS):
                body = {"prompt": wide(rng), "instructions": wide(rng), "title": f"s{i}"}
                created = http.post("/api/agent", content=json.dumps(body, ensure_ascii=False))
                assert created.status_code == 201, created.text
                made.append({**body, "id": created.json()["id"]})
        yield server, key, made


async def test_the_list_answers_bounded_summaries_and_pages_on(
    keyed: tuple[ServerProcess, str, list[dict[str, Any]]],
) -> None:
    server, key, made = keyed
    by_id = {m["id"]: m for m in made}
    seen: list[str] = []
    pages = 0
    async with client(server.url, key) as http:
        token = None
        while True:
            params: dict[str, Any] = {"limit": 50, **({"pageToken": token} if token else {})}
            page = await http.get("/api/agent", params=params)
            assert page.status_code == 200, page.text
            assert len(page.content) <= MAX_BYTES  # 10 items would be 160 kB
            body = page.json()
            for item in body["sessions"]:
                whole = by_id[item["id"]]
                assert item["prompt"] == whole["prompt"][:EXCERPT]
                assert item["instructions"] == whole["instructions"][:EXCERPT]
                assert item["truncated"] == ["prompt", "instructions"]
                seen.append(item["id"])
            pages += 1
            token = body["nextPageToken"]
            if token is None:
                break
        # Fewer than `limit` a page, and every session once, newest first.
        assert pages > 1
        assert seen == [m["id"] for m in reversed(made)]
        # One session's GET stays whole.
        one = (await http.get(f"/api/agent/{made[0]['id']}")).json()
        assert one["prompt"] == made[0]["prompt"]
        assert one["instructions"] == made[0]["instructions"]
        assert "truncated" not in one


async def test_threads_search_shows_no_big_text_and_is_bounded(
    keyed: tuple[ServerProcess, str, list[dict[str, Any]]],
) -> None:
    server, key, made = keyed
    async with client(server.url, key) as http:
        found = await http.post("/agent-protocol/threads/search", json={"limit": 100})
        assert found.status_code == 200, found.text
        assert len(found.content) <= MAX_BYTES
        assert {t["thread_id"] for t in found.json()} == {m["id"] for m in made}
        assert EMOJI[0] not in found.text and not any(e in found.text for e in EMOJI)


async def test_listing_does_not_grow_the_server(
    keyed: tuple[ServerProcess, str, list[dict[str, Any]]],
) -> None:
    """Summaries are small: reading every page ten times leaves the server's RSS where it was
    (the whole texts of these sessions are 8 MB; main's list held them all at once)."""
    server, key, _ = keyed
    process = psutil.Process(server.pid)
    async with client(server.url, key) as http:
        await http.get("/api/agent", params={"limit": 50})  # warm
        before = process.memory_info().rss
        for _ in range(10):
            assert (await http.get("/api/agent", params={"limit": 50})).status_code == 200
        grown = process.memory_info().rss - before
    assert grown < 8 * 1_048_576, grown
    assert json_size({"sessions": []}) < LIST_ENVELOPE_BYTES


def toast_blocks(conn: psycopg.Connection[Any]) -> int:
    """The blocks of the sessions table's TOAST read so far (this backend's counts flushed)."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.commit()  # the backend flushes its counts as it goes idle, before it answers
    conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = conn.execute(
        "SELECT toast_blks_read + toast_blks_hit FROM pg_statio_user_tables"
        " WHERE relname = 'sessions'"
    )
    (blocks,) = cur.fetchone() or (0,)
    conn.commit()
    return int(blocks)


def test_the_list_statement_reads_no_big_text_whole(
    isolated_db: str, keyed: tuple[ServerProcess, str, list[dict[str, Any]]]
) -> None:
    """The list's SQL fetches one TOAST chunk of each big text (`left()`'s slice), where reading
    the columns whole fetches them all: PostgreSQL's own block counts."""
    _, _, made = keyed
    with psycopg.connect(isolated_db) as conn:
        cur = conn.execute("SELECT owner_id FROM sessions WHERE id = %s", (made[0]["id"],))
        (owner,) = cur.fetchone() or ("",)
        conn.commit()
        start = toast_blocks(conn)
        params = {
            "owner": owner,
            "statuses": None,
            "after_ts": None,
            "after_id": None,
            "limit": 51,
            "pattern": None,
            "excerpt": EXCERPT,
        }
        listed = conn.execute(_LIST_SESSIONS, params).fetchall()
        conn.commit()
        by_list = toast_blocks(conn) - start
        whole = conn.execute(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE owner_id = %s", (owner,)
        ).fetchall()
        conn.commit()
        by_whole = toast_blocks(conn) - start - by_list
    assert len(listed) == len(whole) == SESSIONS
    assert by_list <= 4 * SESSIONS, by_list  # a chunk or two of each of the 2 texts
    assert by_whole > 10 * by_list, (by_whole, by_list)
