"""Tools for tests, loaded by workers through FERRYMAN_TOOL_MODULES=tests.tools:TOOLS (`TOOLS_ENV`),
as a `ferryman.tools` plug-in would add them."""

from __future__ import annotations

import asyncio
from typing import Any

from app.agent.tools import Tool, ToolContext, ToolError

TOOLS_ENV = {"FERRYMAN_TOOL_MODULES": "tests.tools:TOOLS"}


def _append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line)


async def _record(arguments: dict[str, Any], context: ToolContext) -> str:
    # The side effect happens first, then the call lingers: a crash in the pause leaves a call
    # that did take effect but has no result.
    line = f"{arguments['text']} {context.idempotency_key}\n"
    await asyncio.to_thread(_append, arguments["path"], line)
    await asyncio.sleep(float(arguments.get("linger", 0)))
    return "recorded"


async def _explode(arguments: dict[str, Any], context: ToolContext) -> str:
    raise RuntimeError(str(arguments.get("message", "boom")))


async def _slow(arguments: dict[str, Any], context: ToolContext) -> str:
    await asyncio.sleep(float(arguments["seconds"]))
    return "slow finished"


async def _refuse(arguments: dict[str, Any], context: ToolContext) -> str:
    raise ToolError("not today")


async def _big(arguments: dict[str, Any], context: ToolContext) -> str:
    return "x" * int(arguments["bytes"])


SECONDS = {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]}

TOOLS = [
    Tool(
        name="record",
        description="Append a line to a file (not idempotent).",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "text": {"type": "string"},
                "linger": {"type": "number", "minimum": 0},
            },
            "required": ["path", "text"],
        },
        run=_record,
        idempotent=False,
    ),
    Tool(
        name="explode",
        description="Raise an exception.",
        parameters={"type": "object", "properties": {"message": {"type": "string"}}},
        run=_explode,
        idempotent=True,
    ),
    Tool("slow", "Sleep; the default timeout.", SECONDS, _slow),
    Tool("quick", "Sleep; its own 0.3 s timeout.", SECONDS, _slow, timeout=0.3),
    Tool("refuse", "Raise ToolError.", {"type": "object"}, _refuse),
    Tool(
        "big",
        "Return this many bytes.",
        {"type": "object", "properties": {"bytes": {"type": "integer"}}, "required": ["bytes"]},
        _big,
        idempotent=True,
    ),
]
