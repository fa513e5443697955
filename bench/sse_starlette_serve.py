"""`python -m app` with every SSE response sent by sse-starlette's `EventSourceResponse` instead of
Ferryman's own `EventStreamResponse` (a StreamingResponse), for the A/B the design asks of the
two: `python -m bench.owner_fanout --sse sse-starlette` (and `bench.slow_readers`) start this.

The stream bodies are the same bytes either way (frames are built before the response sees
them; sse-starlette passes bytes through); Ferryman's pings stay, sse-starlette's are off.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from sse_starlette import EventSourceResponse
from starlette.types import Receive, Scope, Send

from app.api import streams
from app.streams.sse import DirectWrites
from ferryman.cli import main


class SseStarletteResponse(EventSourceResponse):
    """What `EventStreamResponse` promises (the stream closed and the slot released however it
    ends), on sse-starlette's machinery."""

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        release: Callable[[], None],
        direct: DirectWrites | None = None,  # never set: every frame goes through sse-starlette
    ) -> None:
        super().__init__(body, ping=0, headers=streams.SSE_HEADERS)
        self.stream = body
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.stream.aclose()
            self.release()


streams.EventStreamResponse = SseStarletteResponse  # type: ignore[misc,assignment]

if __name__ == "__main__":
    main()
