"""The tiny bigram model behaves as documented against llama.cpp's real server (via xllamacpp).

Without xllamacpp (or gguf, numpy) these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.llm.server import LlamaServer, llama_server, require_xllamacpp
from tests.llm.tiny_model import (
    GET_NOTE_TOOL,
    PLAIN_ANSWER,
    TICK,
    TOOL_ANSWER,
    TOOL_ARGUMENTS,
    TOOL_NAME,
    write_tiny_model,
)

HI = [{"role": "user", "content": "hi"}]
Chunk = dict[str, Any]

# The helpers open a fresh connection per request on purpose: llama.cpp closes the connection
# right after a streamed response (while announcing keep-alive), so a pooled client that reuses
# it at once can fail with "Server disconnected without sending a response".


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_xllamacpp()
    return write_tiny_model(tmp_path_factory.mktemp("llm") / "tiny.gguf")


@pytest.fixture(scope="module")
def llm(model: Path) -> Iterator[LlamaServer]:
    with llama_server(model) as server:
        yield server


def post(llm: LlamaServer, **body: Any) -> Chunk:
    response = httpx.post(llm.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    result: Chunk = response.json()
    return result


def stream(llm: LlamaServer, **body: Any) -> list[Chunk]:
    """The chunks of a streamed completion; checks that it ends with ``data: [DONE]``."""
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    url = llm.base_url + "/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        assert response.status_code == 200, response.read()
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def text_of(chunks: list[Chunk]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def finish_of(chunks: list[Chunk]) -> str:
    """The finish_reason, which only the last chunk with a choice carries."""
    reasons: list[str | None] = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert all(r is None for r in reasons[:-1]) and reasons[-1] is not None
    return reasons[-1]


def usage_of(chunks: list[Chunk]) -> Chunk:
    """llama.cpp sends usage in one last chunk with no choices, as OpenAI does."""
    assert chunks[-1]["choices"] == []
    usage: Chunk = chunks[-1]["usage"]
    assert all("usage" not in c for c in chunks[:-1])
    return usage


def test_plain_chat_streams_the_fixed_sentence(llm: LlamaServer) -> None:
    chunks = stream(llm, messages=HI)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert text_of(chunks) == PLAIN_ANSWER
    assert finish_of(chunks) == "stop"
    assert usage_of(chunks)["completion_tokens"] == 7  # 6 words and end of turn


def test_plain_chat_without_streaming(llm: LlamaServer) -> None:
    choice = post(llm, messages=HI, temperature=1.5)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": PLAIN_ANSWER}
    assert choice["finish_reason"] == "stop"


def test_tool_call_streams_name_once_and_arguments_in_pieces(llm: LlamaServer) -> None:
    chunks = stream(llm, messages=HI, tools=[GET_NOTE_TOOL])
    calls = [c["choices"][0]["delta"]["tool_calls"] for c in chunks[1:-2]]
    assert all(len(call) == 1 and call[0]["index"] == 0 for call in calls)
    first, *rest = (call[0] for call in calls)
    assert first["function"]["name"] == TOOL_NAME and first["id"] and first["type"] == "function"
    assert all("name" not in d["function"] and "id" not in d for d in rest)
    arguments = "".join(d["function"]["arguments"] for d in [first, *rest])
    assert len(rest) >= 2 and json.loads(arguments) == TOOL_ARGUMENTS
    assert text_of(chunks) == ""
    assert finish_of(chunks) == "tool_calls"
    assert usage_of(chunks)["completion_tokens"] == 7


@pytest.mark.parametrize("tool_choice", [None, "auto", "required"])
def test_tool_call_without_streaming(llm: LlamaServer, tool_choice: str | None) -> None:
    extra = {"tool_choice": tool_choice} if tool_choice else {}
    choice = post(llm, messages=HI, tools=[GET_NOTE_TOOL], **extra)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == ""  # llama.cpp sends "", not null
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == TOOL_NAME
    assert json.loads(call["function"]["arguments"]) == TOOL_ARGUMENTS


@pytest.mark.parametrize("content", ["", None], ids=["empty", "null"])
def test_tool_result_is_answered_in_words(llm: LlamaServer, content: str | None) -> None:
    function = {"name": TOOL_NAME, "arguments": json.dumps(TOOL_ARGUMENTS)}
    call = {"id": "c1", "type": "function", "function": function}
    messages = [
        *HI,
        {"role": "assistant", "content": content, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "the note"},
    ]
    chunks = stream(llm, messages=messages, tools=[GET_NOTE_TOOL])
    assert text_of(chunks) == TOOL_ANSWER
    assert finish_of(chunks) == "stop"


def test_tick_runs_until_max_tokens(llm: LlamaServer) -> None:
    started = time.monotonic()
    chunks = stream(llm, messages=[{"role": "user", "content": TICK}], max_tokens=500)
    elapsed = time.monotonic() - started
    assert text_of(chunks) == " ".join([TICK] * 500)
    assert finish_of(chunks) == "length"
    assert usage_of(chunks)["completion_tokens"] == 500
    print(f"500 ticks streamed in {elapsed:.3f}s")


def test_a_stopped_server_stalls_and_a_killed_one_cuts_the_stream(model: Path) -> None:
    body = {"stream": True, "max_tokens": 100_000, "messages": [{"role": "user", "content": TICK}]}
    with llama_server(model) as llm:
        url = llm.base_url + "/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=httpx.Timeout(5, read=0.5)) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            llm.stop()
            # Lines already in the socket may still arrive; then the stream stalls.
            with pytest.raises(httpx.ReadTimeout):
                for _ in lines:
                    pass
            llm.cont()
        with httpx.stream("POST", url, json=body, timeout=10) as response:
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
            llm.kill()
            with pytest.raises(httpx.RemoteProtocolError):  # no last chunk, no [DONE]
                for _ in lines:
                    pass
        with pytest.raises(httpx.ConnectError):
            httpx.get(llm.base_url + "/models")
        old_url = llm.base_url
        llm.start()  # back on the same port
        assert llm.base_url == old_url
        assert text_of(stream(llm, messages=HI)) == PLAIN_ANSWER
