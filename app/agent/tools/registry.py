"""The tool registry: JSON-schema arguments, an idempotent flag and a timeout per tool.

Third-party tools register through the `ferryman.tools` entry-point group: each entry point
names a `Tool` or a list of them.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol
from uuid import UUID

from jsonschema import Draft202012Validator

from app.agent.models.base import ToolSpec

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ferryman.tools"


class NotesPort(Protocol):
    """Per-session notes, written through the runner's fenced log."""

    async def put(self, key: str, text: str) -> None: ...

    async def get(self, key: str) -> str | None: ...


@dataclass(frozen=True)
class ToolContext:
    session_id: UUID
    call_id: str
    # Stable for one call, whatever attempt runs it: for tools with external side effects.
    idempotency_key: str
    attempt: int
    notes: NotesPort


class ToolError(Exception):
    """A tool failed in a way the model should hear about (becomes an error result)."""


ToolFunction = Callable[[dict[str, Any], ToolContext], Awaitable[str]]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: ToolFunction
    idempotent: bool = False
    timeout: float | None = None  # seconds; None: the default (FERRYMAN_TOOL_TIMEOUT)
    ends_turn: bool = False  # ask_user: the session waits for the user afterwards
    requires_approval: bool = False  # every call waits for a person's approval
    source: str = "plugin"  # "builtin", "plugin" or "mcp:<server>"
    _validator: Draft202012Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        Draft202012Validator.check_schema(self.parameters)
        object.__setattr__(self, "_validator", Draft202012Validator(self.parameters))

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def catalog_entry(self) -> dict[str, Any]:
        """How GET /api/tools shows it."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
            "idempotent": self.idempotent,
            "requiresApproval": self.requires_approval,
            "source": self.source,
        }

    def argument_errors(self, arguments: dict[str, Any]) -> list[str]:
        return [
            f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
            for error in self._validator.iter_errors(arguments)
        ]


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def replace_source(self, source: str, tools: Iterable[Tool]) -> None:
        """Swap every tool of one source (an MCP server whose tools were listed again)."""
        kept = {n: t for n, t in self._tools.items() if t.source != source}
        for tool in tools:
            if tool.name in kept:
                log.warning("tool %s of %s left out: the name is taken", tool.name, source)
                continue
            kept[tool.name] = tool
        self._tools = kept

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def tools(self) -> list[Tool]:
        return [self._tools[n] for n in self.names()]

    def turn_enders(self) -> frozenset[str]:
        """Names of the tools after which the session waits for the user."""
        return frozenset(name for name, tool in self._tools.items() if tool.ends_turn)

    def select(self, names: list[str] | None) -> list[Tool]:
        """The tools a session may use: the named ones (unknown names ignored), or all."""
        if names is None:
            return [self._tools[n] for n in self.names()]
        return [self._tools[n] for n in names if n in self._tools]

    def register_all(self, loaded: object) -> None:
        """Register a `Tool` or a list of them (what a plug-in exports)."""
        for tool in loaded if isinstance(loaded, list | tuple) else [loaded]:
            if not isinstance(tool, Tool):
                raise TypeError(f"not a ferryman Tool: {tool!r}")
            self.register(tool)

    @classmethod
    def with_plugins(cls, tools: Iterable[Tool], modules: Iterable[str] = ()) -> ToolRegistry:
        """`tools`, the `ferryman.tools` entry points, and `module:attribute` specs
        (FERRYMAN_TOOL_MODULES) for tools that are not packaged."""
        registry = cls(tools)
        for entry in entry_points(group=ENTRY_POINT_GROUP):
            try:
                registry.register_all(entry.load())
            except Exception:
                log.exception("could not load tool plug-in %s", entry.value)
        for spec in modules:
            module_name, _, attribute = spec.partition(":")
            registry.register_all(getattr(importlib.import_module(module_name), attribute))
        return registry
