"""Delegation, pure (docs/delegation.md): the tool a delegate is offered as, the check that no
chain of delegates loops, and what a child's end tells its parent's call.

A session's `delegates` are stored resolved, `{assistantId, tool, description}`: the tool name
is fixed when the session is made, so the model's history keeps naming the tool it was offered
even if the assistant is renamed later.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from app.agent.conversation import ToolResult
from app.domain import MAX_PROMPT_CHARS

TOOL_PREFIX = "agent__"
# Tool names stay within what every provider takes (`^[a-zA-Z0-9_-]{1,64}$`).
_MAX_TOOL_NAME = 64
# The task becomes the child's prompt: a prompt's length (MAX_PROMPT_CHARS).
TASK_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_PROMPT_CHARS,
            "description": "What the assistant is to do.",
        }
    },
    "required": ["task"],
}

K = TypeVar("K", bound=Hashable)


def tool_names(names: Sequence[str]) -> list[str]:
    """The tool name of each delegate, from its assistant's name: `agent__<slug>`, made unique
    among them by a suffix (`_2`, `_3`, ...)."""
    taken: set[str] = set()
    out: list[str] = []
    for name in names:
        slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "assistant"
        base = (TOOL_PREFIX + slug)[: _MAX_TOOL_NAME - 4]
        tool, n = base, 1
        while tool in taken:
            n += 1
            tool = f"{base}_{n}"
        taken.add(tool)
        out.append(tool)
    return out


def description(name: str, text: str | None) -> str:
    about = f": {text}" if text else ""
    return (
        f"Hand a task to the assistant {name!r}{about}. It works on it in a session of its own"
        " and its final answer is this call's result."
    )


def find_cycle(graph: Mapping[K, Iterable[K]], root: K) -> list[K] | None:
    """A chain of delegates from `root` that comes back to a node already on it (the chain,
    that node last), or None when every chain from `root` ends. `graph`: each node's
    delegates; a node it does not list delegates to nobody. Iterative: a chain may be as long
    as an owner has assistants."""
    path: list[K] = [root]
    on_path: set[K] = {root}
    done: set[K] = set()
    stack: list[Iterator[K]] = [iter(graph.get(root, ()))]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            done.add(path[-1])
            on_path.discard(path.pop())
        elif nxt in on_path:
            return [*path, nxt]
        elif nxt not in done:
            path.append(nxt)
            on_path.add(nxt)
            stack.append(iter(graph.get(nxt, ())))
    return None


def offers_delegates(depth: int, max_depth: int) -> bool:
    """Whether a session `depth` delegations deep may delegate further (FERRYMAN_MAX_AGENT_DEPTH:
    a child at that depth is offered no delegate tools)."""
    return depth < max_depth


def child_result(
    call_id: str, name: str, status: str, answer: str | None, error: Any
) -> ToolResult:
    """The result of a delegate call, from its child's end (`delegate_result`)."""
    if status == "succeeded":
        return ToolResult(call_id, name, answer or "(the assistant gave no answer)")
    if status == "cancelled":
        return ToolResult(call_id, name, "the delegated session was cancelled", is_error=True)
    detail = ""
    if isinstance(error, Mapping):
        detail = f": {error.get('code')}: {error.get('message')}"
    return ToolResult(call_id, name, f"the delegated session {status}{detail}", is_error=True)
