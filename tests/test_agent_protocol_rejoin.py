"""Joins of a run's stream while the thread's next run streams, through `langgraph-sdk` against a
real server and worker: joined without `Last-Event-ID`, or with any id the run's stream sent
(an event's or a token chunk's), the stream is exactly what the run's own stream sent after
that id, every token once and nothing of another run (issue 23)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import StreamPart

from tests.support import StartWorker, ready
from tests.test_agent_protocol import (  # noqa: F401 (fixtures)
    GRAPH,
    collect,
    context,
    protocol_api,
    sdk,
    streamed_texts,
    text_of,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FIRST, SECOND = "Let me write that down for you.", "Done, it is noted now."
SLOW = " ".join(f"w{n}" for n in range(40))
SCRIPT = [
    # Run 1: a turn with a tool call, then the answer, each in several chunks.
    {
        "text": FIRST,
        "chunks": 6,
        "delayMs": 900,
        "toolCalls": [{"name": "put_note", "arguments": {"key": "k", "text": "v"}}],
    },
    {"text": SECOND, "chunks": 5, "delayMs": 750},
    # Run 2: one slow turn, open while the joins are made.
    {"text": SLOW, "chunks": 40, "delayMs": 24000},
]
# The last: a chunk's `messages` id followed by its `events` twin, and every other event.
MODE_SETS = [
    ["values", "messages-tuple"],
    ["events"],
    ["updates", "messages-tuple"],
    ["values", "updates", "messages-tuple", "events", "custom"],
]

Part = tuple[str | None, str, Any]


def token(part: StreamPart) -> str | None:
    """The message id of a token chunk's event (`<seq>.<k>`), None for any other."""
    if part.id is None or "." not in part.id:
        return None
    if part.event == "messages":
        return str(part.data[0]["id"])
    return str(part.data["data"]["chunk"]["id"])


def final_chunk(part: StreamPart) -> str | None:
    """The message id of a turn's last `messages` chunk (made of its logged message)."""
    if (
        part.event == "messages"
        and part.data[0]["type"] == "AIMessageChunk"
        and token(part) is None
    ):
        return str(part.data[0]["id"])
    return None


def replayed(parts: list[StreamPart], texts: dict[str, str]) -> list[Part]:
    """What a join sends of turns that ended before it joined: no token chunks, the last
    `messages` chunk with the whole text (docs/langgraph.md, streams)."""
    out: list[Part] = []
    for part in parts:
        if token(part) is not None:
            continue
        data = part.data
        message = final_chunk(part)
        if message is not None:
            data = copy.deepcopy(data)
            data[0]["content"] = texts[message]
        out.append((part.id, part.event, data))
    return out


def triples(parts: list[StreamPart]) -> list[Part]:
    return [(p.id, p.event, p.data) for p in parts]


def expected_after(
    parts: list[StreamPart], cut: str | None, closed: set[str], texts: dict[str, str]
) -> list[Part]:
    """The run's events after id `cut` (all without one) as a join sends them: the turns that
    had ended before the join and that the client had not been inside replayed whole."""
    start = 0 if cut is None else [p.id for p in parts].index(cut) + 1
    seen = {token(p) for p in parts[:start]} | {final_chunk(p) for p in parts[:start]}
    out: list[Part] = []
    for part in parts[start:]:
        message = token(part) or final_chunk(part)
        if message in closed and message not in seen:
            out.extend(replayed([part], texts))
        else:
            out.append((part.id, part.event, part.data))
    return out


def outline(parts: list[Part]) -> str:
    return " ".join(
        f"{i}:{e}" + (f":{d[0]['content']!r}" if e == "messages" else "") for i, e, d in parts
    )


def check_join(
    original: list[StreamPart],
    joined: list[StreamPart],
    cut: str | None,
    closed: set[str],
    texts: dict[str, str],
) -> None:
    """`joined` (from id `cut`) against the run's own stream, `original`: the same events, and
    each AI message's text once, counting the chunks the client had before `cut`."""
    expected = expected_after(original, cut, closed, texts)
    label = f"after {cut}: got {outline(triples(joined))}; expected {outline(expected)}"
    assert triples(joined) == expected, label
    if any(p.event == "messages" for p in original):
        start = 0 if cut is None else [p.id for p in original].index(cut) + 1
        had = [p for p in original[:start] if token(p) or final_chunk(p)]
        whole = streamed_texts(had + joined)
        assert set(whole) == set(streamed_texts(original)), label
        assert whole == {m: texts[m] for m in whole}, label


@pytest.mark.parametrize("modes", MODE_SETS, ids=["+".join(m) for m in MODE_SETS])
async def test_joins_while_the_next_run_streams(
    sdk: LangGraphClient,  # noqa: F811 (the fixture)
    start_worker: StartWorker,
    modes: list[str],
) -> None:
    await ready(start_worker())
    tid = (await sdk.threads.create())["thread_id"]
    first = await collect(
        sdk.runs.stream(
            tid,
            GRAPH,
            input={"messages": [{"role": "user", "content": "note k=v"}]},
            context=context(SCRIPT),
            stream_mode=modes,
        )
    )
    assert first[-1].event == "end" and first[-1].data["status"] == "success"
    assert any(token(p) for p in first), "run 1 streamed no token chunk"
    state = await sdk.threads.get_state(tid)
    texts = {
        m["id"]: text_of(m["content"]) for m in state["values"]["messages"] if m["type"] == "ai"
    }
    assert sorted(texts.values()) == sorted([FIRST, SECOND])

    second: list[StreamPart] = []
    mid_turn = asyncio.Event()

    async def follow() -> None:
        async for part in sdk.runs.stream(
            tid,
            GRAPH,
            input={"messages": [{"role": "user", "content": "count"}]},
            stream_mode=modes,
        ):
            second.append(part)
            if sum(1 for p in second if token(p)) >= 4:
                mid_turn.set()

    task = asyncio.create_task(follow())
    try:
        await asyncio.wait_for(mid_turn.wait(), 60)
        # (a) Run 1, ended, from its start and from each id it sent, while run 2 streams.
        first_ids: list[str | None] = [None, *(p.id for p in first)]
        run_1 = first[0].data["run_id"]
        joins = [
            await collect(sdk.runs.join_stream(tid, run_1, stream_mode=modes, last_event_id=cut))
            for cut in first_ids
        ]
        # (b) Run 2, mid-turn, from its start and from each id it sent so far.
        second_ids: list[str | None] = [None, *(p.id for p in second)]
        run_2 = second[0].data["run_id"]
        assert not task.done(), "run 2 ended before the joins"

        async def join_second(cut: str | None) -> list[StreamPart]:
            return await collect(
                sdk.runs.join_stream(tid, run_2, stream_mode=modes, last_event_id=cut)
            )

        later = await asyncio.wait_for(asyncio.gather(*map(join_second, second_ids)), 90)
        await asyncio.wait_for(task, 90)
    finally:
        task.cancel()
    for cut, joined in zip(first_ids, joins, strict=True):
        check_join(first, joined, cut, set(texts), texts)
    assert second[-1].event == "end" and second[-1].data["status"] == "success"
    state = await sdk.threads.get_state(tid)
    texts_2 = {
        m["id"]: text_of(m["content"]) for m in state["values"]["messages"] if m["type"] == "ai"
    }
    for cut, joined in zip(second_ids, later, strict=True):
        check_join(second, joined, cut, set(), texts_2)
