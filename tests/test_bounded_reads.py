"""Reads and events bounded in bytes: a transcript page stops at a byte budget and says
where to go on, the runner reads the log in such pages, and one event cannot carry more than
FERRYMAN_MAX_EVENT_BYTES of model text or tool output (cut with a visible marker)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.agent.conversation import (
    AssistantMessage,
    ToolCall,
    ToolResult,
    bounded_reply,
    bounded_result,
    clip_text,
)
from tests.support import (
    TERMINAL,
    ServerProcess,
    StartWorker,
    client,
    new_session,
    of_type,
    ready,
    running,
    wait_for_status,
)
from tests.tools import TOOLS_ENV

# --- pure -----------------------------------------------------------------------------------


def test_text_that_fits_is_kept() -> None:
    assert clip_text("hello", 5) == "hello"
    assert clip_text("", 0) == ""


def test_text_that_does_not_fit_is_cut_with_a_marker() -> None:
    cut = clip_text("😀" * 1000, 400)
    assert len(cut.encode()) <= 400
    assert cut.startswith("😀")
    assert cut.endswith("more bytes cut: FERRYMAN_MAX_EVENT_BYTES]")
    kept = cut.split("\n[")[0]
    assert f"[… {4000 - len(kept.encode())} more bytes cut" in cut


@given(st.text(max_size=2000), st.integers(min_value=64, max_value=3000))
def test_clipping_bounds_and_never_splits_a_character(text: str, limit: int) -> None:
    cut = clip_text(text, limit)
    assert len(cut.encode()) <= max(limit, len(text.encode()) if cut == text else limit)
    if cut != text:
        assert text.startswith(cut.split("\n[… ")[0])


def test_a_reply_is_bounded_text_and_calls() -> None:
    huge = {"text": "x" * 50_000}
    reply = AssistantMessage(
        "y" * 50_000, (ToolCall("a", "put_note", huge), ToolCall("b", "get_note", {"key": "k"}))
    )
    bounded = bounded_reply(reply, 16_384)
    assert len(json.dumps(bounded.wire()).encode()) < 16_384 + 1024
    assert bounded.text.endswith("FERRYMAN_MAX_EVENT_BYTES]")
    too_big, small = bounded.tool_calls
    assert too_big.arguments == {} and too_big.invalid_arguments is not None
    assert small == reply.tool_calls[1]  # what fits is left alone
    assert bounded_reply(small_reply := AssistantMessage("ok"), 4096) is small_reply


def test_a_result_is_bounded() -> None:
    result = ToolResult("a", "get_note", "z" * 100_000)
    assert len(bounded_result(result, 8192).content.encode()) <= 8192
    small = ToolResult("a", "get_note", "fine")
    assert bounded_result(small, 8192) is small


# --- a real server and worker ---------------------------------------------------------------

PAGE = 65_536
EVENT = 8192
LIMITS = {"FERRYMAN_TRANSCRIPT_PAGE_BYTES": str(PAGE), "FERRYMAN_MAX_EVENT_BYTES": str(EVENT)}


@pytest.fixture(scope="module")
def bounded_api(isolated_db: str) -> Iterator[ServerProcess]:
    with running(ServerProcess(isolated_db, env=LIMITS)) as server:
        yield server


async def pages(http: httpx.AsyncClient, sid: str, limit: int = 1000) -> list[dict[str, Any]]:
    """Every page of a transcript, following `nextAfter`."""
    found: list[dict[str, Any]] = []
    after: int | None = 0
    while after is not None:
        response = await http.get(
            f"/api/agent/{sid}/transcript", params={"after": after, "limit": limit}
        )
        assert response.status_code == 200, response.text
        found.append(response.json())
        after = found[-1]["nextAfter"]
    return found


async def test_transcripts_page_by_bytes_and_runs_cut_big_events(
    bounded_api: ServerProcess, key: str, start_worker: StartWorker
) -> None:
    await ready(start_worker({**LIMITS, **TOOLS_ENV}))
    huge_args = {"key": "k", "text": "n" * 15_000}  # too big for the event: refused
    filler = {"text": "b" * 20_000, "toolCalls": [{"name": "sleep", "arguments": {"seconds": 0}}]}
    script = [
        {"text": "😀" * 12_000, "toolCalls": [{"name": "put_note", "arguments": huge_args}]},
        {"text": "a", "toolCalls": [{"name": "big", "arguments": {"bytes": 1_000_000}}]},
        *[filler] * 30,
        {"text": "done"},
    ]
    async with client(bounded_api.url, key) as http:
        sid = await new_session(http, "go", script=script)
        assert (await wait_for_status(http, sid, TERMINAL, timeout=60))["status"] == "succeeded"
        # A follow-up: the next run reads the whole log again, in pages of 64 kB.
        await http.post(f"/api/agent/{sid}/messages", json={"text": "and now?"})
        done = await wait_for_status(http, sid, TERMINAL, timeout=60)
        assert done["status"] == "succeeded"
        found = await pages(http, sid)
    events = [e for page in found for e in page["events"]]
    assert [e["seq"] for e in events] == list(range(1, done["lastSeq"] + 1))
    assert found[-1]["nextAfter"] is None
    assert len(found) >= 3  # the byte budget cut pages well before the 1000-event limit
    for page in found:
        sizes = [len(json.dumps(e["data"], ensure_ascii=False).encode()) for e in page["events"]]
        assert len(sizes) == 1 or sum(sizes[:-1]) < PAGE, sizes
    # Model text and tool output beyond the limit were cut, visibly.
    first = of_type(events, "assistant_message")[0]["data"]
    assert first["text"].endswith("FERRYMAN_MAX_EVENT_BYTES]")
    refused, cut = (r["data"] for r in of_type(events, "tool_result")[:2])
    assert refused["isError"] and refused["content"].startswith("invalid arguments")
    assert cut["name"] == "big" and cut["content"].endswith("FERRYMAN_MAX_EVENT_BYTES]")
    sizes = [len(json.dumps(e["data"], ensure_ascii=False).encode()) for e in events[1:]]
    assert max(sizes) < EVENT + 1024, max(sizes)
    # The second run saw the whole conversation: the script went on past its end.
    assert of_type(events, "assistant_message")[-1]["data"]["text"] == "You said: and now?"


async def test_a_page_of_one_event_bigger_than_the_budget(
    bounded_api: ServerProcess, key: str
) -> None:
    prompt = "p" * 100_000  # a user message is never cut: it is bigger than a page
    async with client(bounded_api.url, key) as http:
        sid = await new_session(http, prompt)
        (page,) = await pages(http, sid)
    assert [e["data"]["text"] for e in page["events"]] == [prompt]
    assert page["nextAfter"] is None and page["lastSeq"] == 1
