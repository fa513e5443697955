"""Tools: the registry (schemas, idempotency, timeouts), built-ins, and plug-ins."""

from collections.abc import Iterable

from app.agent.tools.builtin import BUILTIN_TOOLS
from app.agent.tools.registry import (
    NotesPort,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)


def default_registry(modules: Iterable[str] = ()) -> ToolRegistry:
    """The built-ins and every plug-in: what a worker offers."""
    return ToolRegistry.with_plugins(BUILTIN_TOOLS, modules)


__all__ = ["NotesPort", "Tool", "ToolContext", "ToolError", "ToolRegistry", "default_registry"]
