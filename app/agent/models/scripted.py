"""The scripted model: deterministic turns for demos and tests (SPEC section 6)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from app.agent.conversation import AssistantMessage, StopReason, ToolCall, last_user_text
from app.agent.models.base import DeltaSink, ModelRequest
from app.agent.resume import completed_turns


def split_chunks(text: str, chunks: int) -> list[str]:
    """`text` in `chunks` nearly equal pieces (fewer when the text is shorter)."""
    if not text:
        return []
    count = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), count)
    pieces, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


class ScriptedModel:
    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = script

    def turn_for(self, request: ModelRequest) -> dict[str, Any]:
        index = completed_turns(request.conversation)
        if index < len(self.script):
            return self.script[index]
        return {"text": f"You said: {last_user_text(request.conversation)}", "stopReason": "stop"}

    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        turn = self.turn_for(request)
        text = str(turn.get("text") or "")
        pieces = split_chunks(text, int(turn.get("chunks") or 1))
        delay = float(turn.get("delayMs") or 0) / 1000
        if pieces:
            for piece in pieces:
                if delay:
                    await asyncio.sleep(delay / len(pieces))
                await on_delta(piece)
        elif delay:
            await asyncio.sleep(delay)
        calls = tuple(
            # Fresh ids on every play: a replayed turn re-issues the same calls under new ids,
            # so their results never collide with the interrupted ones.
            ToolCall(
                f"call_{uuid.uuid4().hex[:12]}", str(c["name"]), dict(c.get("arguments") or {})
            )
            for c in turn.get("toolCalls") or ()
        )
        stop: StopReason = turn.get("stopReason") or ("tool_use" if calls else "stop")
        return AssistantMessage(text=text, tool_calls=calls, stop_reason=stop)
