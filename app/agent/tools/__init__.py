"""Tools: the registry (schemas, idempotency, timeouts), built-ins, and plug-ins."""

from app.agent.tools.registry import (
    NotesPort,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
)

__all__ = ["NotesPort", "Tool", "ToolContext", "ToolError", "ToolRegistry"]
