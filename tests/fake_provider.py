"""A model provider that misbehaves on cue: a real HTTP server (uvicorn, in a thread, on an
ephemeral 127.0.0.1 port) speaking OpenAI's chat completions and Anthropic's Messages API, each
answer scripted by the test. For the faults a real model server cannot be made to show on
demand: 429 with Retry-After, 5xx, streams cut off or stalled, error events mid-stream."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Frame:
    data: str
    event: str | None = None


@dataclass
class Reply:
    """One answer: SSE frames, or an HTTP error, or a plain body."""

    frames: list[Frame] = field(default_factory=list)
    status: int = 200
    body: Any = None  # the JSON of an error answer, or the text of a plain one
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    pause: float = 0.0  # between frames, so the client reads them one by one
    stall_after: int | None = None  # go silent (for `stall` seconds) after this many frames
    stall: float = 0.0
    drop_after: int | None = None  # break the connection after this many frames


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeProvider:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Seen] = []
        self.root = ""  # http://127.0.0.1:PORT

    @property
    def openai_url(self) -> str:
        return f"{self.root}/v1"

    def reset(self) -> None:
        self.replies.clear()
        self.requests.clear()

    def answer(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    async def handle(self, request: Request) -> Response:
        self.requests.append(
            Seen(request.url.path, dict(request.headers), json.loads(await request.body()))
        )
        reply = self.replies.popleft() if self.replies else Reply(status=599, body="no reply")
        if reply.status != 200:
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        if reply.content_type != "text/event-stream":
            return Response(str(reply.body), media_type=reply.content_type)
        return StreamingResponse(self.stream(reply), media_type="text/event-stream")

    async def stream(self, reply: Reply) -> AsyncIterator[str]:
        for index, frame in enumerate(reply.frames):
            if index == reply.drop_after:
                raise ConnectionAbortedError("the fake provider drops the connection")
            if index == reply.stall_after:
                await asyncio.sleep(reply.stall)
            event = f"event: {frame.event}\n" if frame.event else ""
            yield f"{event}data: {frame.data}\n\n"
            if reply.pause:
                await asyncio.sleep(reply.pause)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.handle, methods=["POST"]),
                Route("/v1/messages", self.handle, methods=["POST"]),
            ]
        )


class Deltas:
    """An `on_delta` sink that keeps what it was given."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    async def __call__(self, text: str) -> None:
        self.pieces.append(text)


@contextmanager
def serving() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    config = uvicorn.Config(
        fake.app(), host="127.0.0.1", port=0, log_level="critical", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="fake-provider", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive(), "the fake provider failed to start"
        assert time.monotonic() < deadline, "the fake provider did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    fake.root = f"http://127.0.0.1:{port}"
    try:
        yield fake
    finally:
        server.should_exit = True
        thread.join(10)


# --- OpenAI chat completions ----------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> Frame:
    return Frame(
        json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake",
                "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
                **extra,
            }
        )
    )


def usage_chunk(prompt: int, completion: int, cached: int = 0) -> Frame:
    return Frame(
        json.dumps(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake",
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                    "prompt_tokens_details": {"cached_tokens": cached},
                },
            }
        )
    )


DONE = Frame("[DONE]")


def text_reply(*pieces: str, finish: str | None = "stop") -> Reply:
    frames = [chunk({"role": "assistant", "content": ""})]
    frames += [chunk({"content": p}) for p in pieces]
    if finish is not None:
        frames.append(chunk(finish=finish))
    frames.append(DONE)
    return Reply(frames)


def tool_reply(name: str, arguments: dict[str, Any], call_id: str = "call_1") -> Reply:
    frames = [
        chunk(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
        ),
        chunk(finish="tool_calls"),
        DONE,
    ]
    return Reply(frames)


def error_reply(status: int, message: str, **headers: str) -> Reply:
    body = {"error": {"message": message, "type": "server_error", "code": None}}
    return Reply(status=status, body=body, headers=headers)


# --- Anthropic Messages ---------------------------------------------------------------------


def event(type_: str, **data: Any) -> Frame:
    return Frame(json.dumps({"type": type_, **data}), event=type_)


def message_start(input_tokens: int = 10, cache_read: int = 0) -> Frame:
    return event(
        "message_start",
        message={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "fake",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": 1,
                "cache_read_input_tokens": cache_read,
                "cache_creation_input_tokens": 0,
            },
        },
    )


def text_block(index: int, *pieces: str) -> list[Frame]:
    return [
        event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *(
            event("content_block_delta", index=index, delta={"type": "text_delta", "text": p})
            for p in pieces
        ),
        event("content_block_stop", index=index),
    ]


def tool_use_block(index: int, call_id: str, name: str, *json_pieces: str) -> list[Frame]:
    start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return [
        event("content_block_start", index=index, content_block=start),
        *(
            event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": p},
            )
            for p in json_pieces
        ),
        event("content_block_stop", index=index),
    ]


def message_end(stop_reason: str | None, output_tokens: int = 5) -> list[Frame]:
    return [
        event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        event("message_stop"),
    ]
