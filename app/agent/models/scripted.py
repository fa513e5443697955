"""The scripted model: deterministic turns for demos and tests (SPEC section 6)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from app.agent.conversation import (
    AssistantMessage,
    Message,
    StopReason,
    Summary,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    last_user_text,
    usage_from_wire,
)
from app.agent.models.base import DeltaSink, ModelFault, ModelRequest
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
        # Faults raised so far, per turn: a turn's `fault` fires its first `times` plays in
        # this run (a crash starts the count again, as a fresh provider connection would).
        self.faults_raised: dict[int, int] = {}

    def turn_for(self, request: ModelRequest) -> tuple[int, dict[str, Any]]:
        index = completed_turns(request.conversation)
        if index < len(self.script):
            return index, self.script[index]
        echo = {"text": f"You said: {last_user_text(request.conversation)}", "stopReason": "stop"}
        return index, echo

    def summary_for(self, covered: tuple[Message, ...]) -> AssistantMessage:
        """A compaction's summary: the `summary` of the last turn it covers when the script
        gives one, else the last three user messages it covers (a summary of summaries stays
        short)."""
        turns = completed_turns(covered)
        if 0 < turns <= len(self.script) and self.script[turns - 1].get("summary"):
            text = str(self.script[turns - 1]["summary"])
        else:
            said = [m.text for m in covered if isinstance(m, (UserMessage, Summary))]
            text = f"Summary of {turns} turns: " + " | ".join(said[-3:])
        read = sum(len(m.text) for m in covered if not isinstance(m, ToolResult))
        return AssistantMessage(text, (), "stop", usage=Usage(read // 4 + 1, len(text) // 4 + 1))

    async def complete(self, request: ModelRequest, on_delta: DeltaSink) -> AssistantMessage:
        if request.compacting:
            return self.summary_for(request.compacting)
        index, turn = self.turn_for(request)
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
        self.raise_fault(index, turn.get("fault"))
        calls = tuple(
            # Fresh ids on every play: a replayed turn re-issues the same calls under new ids,
            # so their results never collide with the interrupted ones.
            ToolCall(
                f"call_{uuid.uuid4().hex[:12]}", str(c["name"]), dict(c.get("arguments") or {})
            )
            for c in turn.get("toolCalls") or ()
        )
        stop: StopReason = turn.get("stopReason") or ("tool_use" if calls else "stop")
        usage = usage_from_wire(turn.get("usage"))
        return AssistantMessage(text=text, tool_calls=calls, stop_reason=stop, usage=usage)

    def raise_fault(self, index: int, fault: dict[str, Any] | None) -> None:
        """Fail the turn as a provider would, after its text streamed (a cut-off answer)."""
        if not fault or self.faults_raised.get(index, 0) >= int(fault.get("times") or 1):
            return
        self.faults_raised[index] = self.faults_raised.get(index, 0) + 1
        retry_after = fault.get("retryAfterMs")
        raise ModelFault(
            fault["kind"],
            f"scripted fault: {fault['kind']}",
            retry_after=retry_after / 1000 if retry_after is not None else None,
        )
