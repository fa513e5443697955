"""Compaction: what the model sees of a long session, as pure functions over its messages.

The log keeps every event. A `session_compacted {throughSeq, summary}` event stands, for the
model, for every message through `throughSeq`: the model sees the session's instructions, the
latest summary, and the messages after it (`model_view`). Where a compaction cuts is chosen by
`choose_cut`: never between a tool call and its result, never past a call still waiting (for an
approval, a client) or a message the model has not answered, and the last `keepRecentTurns`
model turns stay verbatim (docs/compaction.md).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.agent.conversation import AssistantMessage, Message, Summary, ToolResult, UserMessage
from app.agent.models.base import ToolSpec
from app.agent.resume import completed_turns

DEFAULT_KEEP_RECENT_TURNS = 2
# Characters a token stands for, in the estimate of what was added since the provider last
# counted (about right for English text and JSON).
CHARS_PER_TOKEN = 4
DEFAULT_INSTRUCTIONS = (
    "You write the summary that replaces the earlier part of a conversation between a user "
    "and an assistant that uses tools. Keep every fact, decision, open question, file name, "
    "identifier and result the assistant will need to go on; leave out pleasantries. Answer "
    "with the summary only."
)
TRIMMED = "\n[… {} more characters not shown: FERRYMAN_MODEL_TOOL_RESULT_MAX_CHARS]"


@dataclass(frozen=True)
class CompactionSettings:
    """A session's `compaction` (validated by the API)."""

    trigger_tokens: int
    keep_recent_turns: int = DEFAULT_KEEP_RECENT_TURNS
    model: str | None = None  # None: the session's own
    instructions: str | None = None

    @classmethod
    def from_wire(cls, data: Mapping[str, Any] | None) -> CompactionSettings | None:
        if not data:
            return None
        keep = data.get("keepRecentTurns")
        return cls(
            trigger_tokens=int(data["triggerTokens"]),
            keep_recent_turns=DEFAULT_KEEP_RECENT_TURNS if keep is None else int(keep),
            model=data.get("model"),
            instructions=data.get("instructions"),
        )


def compact(view: Sequence[Message], summary: Summary) -> list[Message]:
    """`view` once `summary` is written: the summary (counting the turns it covers), then the
    messages after its `throughSeq`."""
    covered = [m for m in view if isinstance(m, Summary) or m.seq <= summary.through_seq]
    kept = [m for m in view if not isinstance(m, Summary) and m.seq > summary.through_seq]
    return [replace(summary, turns=completed_turns(covered)), *kept]


def model_view(history: Iterable[Message]) -> list[Message]:
    """What the model is shown of a session's messages in log order (a `Summary` where its
    `session_compacted` was logged): the latest summary and what follows its `throughSeq`."""
    view: list[Message] = []
    for message in history:
        if isinstance(message, Summary):
            view = compact(view, message)
        else:
            view.append(message)
    return view


def choose_cut(
    view: Sequence[Message], keep_recent_turns: int, held: Collection[str] = ()
) -> int | None:
    """How many leading messages of `view` (a well-formed conversation: each result right
    after its call) a summary may replace, as many as may be; None when none can go.

    A cut leaves at least the last message and the last `keep_recent_turns` model turns; it
    never falls between a call and its result, never takes a call in `held` (waiting for an
    approval or a client) or a user message no model turn answered, and it is clean in log
    order: everything it takes was logged before everything it leaves (so `throughSeq`
    says exactly where it is)."""
    turn_starts = [i for i, m in enumerate(view) if isinstance(m, AssistantMessage)]
    limit = len(view) - 1
    if keep_recent_turns > 0 and turn_starts:
        limit = min(limit, turn_starts[-min(keep_recent_turns, len(turn_starts))])
    for cut in range(limit, 0, -1):
        if _clean(view, cut, held):
            return cut if _covers_something(view[:cut]) else None
    return None


def _covers_something(prefix: Sequence[Message]) -> bool:
    return any(not isinstance(m, Summary) for m in prefix)


def _clean(view: Sequence[Message], cut: int, held: Collection[str]) -> bool:
    prefix, tail = view[:cut], view[cut:]
    if isinstance(tail[0], ToolResult) or isinstance(prefix[-1], UserMessage):
        return False
    calls = {c.id for m in prefix if isinstance(m, AssistantMessage) for c in m.tool_calls}
    answered = {m.tool_call_id for m in prefix if isinstance(m, ToolResult)}
    if calls - answered or calls & set(held):
        return False
    if any(isinstance(m, ToolResult) and m.tool_call_id in calls for m in tail):
        return False
    # A message not logged yet (seq 0) is newer than any logged one.
    seqs = [m.seq for m in prefix if not isinstance(m, Summary)]
    later = [m.seq for m in tail if m.seq]
    return 0 not in seqs and (not seqs or not later or max(seqs) < min(later))


def message_chars(message: Message) -> int:
    if isinstance(message, AssistantMessage):
        return len(message.text) + sum(
            len(c.name) + len(c.arguments_text()) for c in message.tool_calls
        )
    return len(message.text if not isinstance(message, ToolResult) else message.content)


def estimate_tokens(
    view: Sequence[Message], instructions: str | None, tools: Sequence[ToolSpec]
) -> int:
    """The tokens a request of `view` would take: the provider's count of the last turn it
    answered since the latest summary (its input and output), plus an estimate of what came
    after; with no such count, an estimate of it all (characters / CHARS_PER_TOKEN)."""
    since = max((m.seq for m in view if isinstance(m, Summary)), default=0)
    for index in range(len(view) - 1, -1, -1):
        message = view[index]
        if isinstance(message, AssistantMessage) and message.usage is not None:
            if message.seq and message.seq <= since:
                break  # counted before the summary: a request that is no more
            usage = message.usage
            rest = sum(message_chars(m) for m in view[index + 1 :])
            return usage.input_tokens + usage.output_tokens + rest // CHARS_PER_TOKEN
    chars = len(instructions or "") + sum(message_chars(m) for m in view)
    chars += sum(len(t.name) + len(t.description) + len(json.dumps(t.parameters)) for t in tools)
    return chars // CHARS_PER_TOKEN


def transcript(messages: Iterable[Message], max_chars: int) -> str:
    """The messages a summary replaces, as text for the summarizing model; at most
    `max_chars` (the oldest part is left out, with a marker)."""
    lines = [_line(m) for m in messages]
    text = "\n\n".join(lines)
    if len(text) <= max_chars:
        return text
    return "[… the oldest part is left out]\n" + text[len(text) - max_chars :]


def _line(message: Message) -> str:
    if isinstance(message, Summary):
        return f"Summary of what came before:\n{message.text}"
    if isinstance(message, UserMessage):
        return f"User: {message.text}"
    if isinstance(message, ToolResult):
        kind = "error" if message.is_error else "result"
        return f"Tool {kind} ({message.name}): {trim_text(message.content, 2000)}"
    calls = "".join(f"\nCalls {c.name}({c.arguments_text()})" for c in message.tool_calls)
    return f"Assistant: {message.text}{calls}"


def trim_text(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + TRIMMED.format(len(text) - max_chars)


def trim_results(view: Iterable[Message], max_chars: int) -> list[Message]:
    """`view` with each tool result longer than `max_chars` cut to that, with a marker saying
    how much the model is not shown (the log keeps it whole)."""
    return [
        replace(m, content=trim_text(m.content, max_chars))
        if isinstance(m, ToolResult) and len(m.content) > max_chars
        else m
        for m in view
    ]


def summary_prompt(text: str) -> str:
    return f"Summarize this conversation so far:\n\n{text}"
