"""Built-in tools: sleep, put_note, get_note, ask_user."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from app.agent.tools.registry import Tool, ToolContext, ToolError

MAX_SLEEP_SECONDS = 3600
MAX_NOTE_KEY_CHARS = 200
MAX_NOTE_CHARS = 100_000
MAX_QUESTION_CHARS = 10_000
ASK_USER_CONTENT = "question sent to the user; their answer arrives as the next user message"


async def _sleep(arguments: dict[str, Any], _: ToolContext) -> str:
    # Cancel and lease loss cancel this task: sleeping honours cancel for free.
    await asyncio.sleep(float(arguments["seconds"]))
    return f"slept {arguments['seconds']} s"


async def _put_note(arguments: dict[str, Any], context: ToolContext) -> str:
    if len(arguments["text"]) > MAX_NOTE_CHARS:
        raise ToolError(f"text: at most {MAX_NOTE_CHARS} characters")
    await context.notes.put(arguments["key"], arguments["text"])
    return f"saved note {arguments['key']!r}"


async def _get_note(arguments: dict[str, Any], context: ToolContext) -> str:
    text = await context.notes.get(arguments["key"])
    return json.dumps({"key": arguments["key"], "found": text is not None, "text": text})


async def _ask_user(arguments: dict[str, Any], _: ToolContext) -> str:
    if len(arguments["question"]) > MAX_QUESTION_CHARS:
        raise ToolError(f"question: at most {MAX_QUESTION_CHARS} characters")
    return ASK_USER_CONTENT


BUILTIN_TOOLS = [
    Tool(
        name="sleep",
        description="Wait for a number of seconds.",
        parameters={
            "type": "object",
            "properties": {
                "seconds": {"type": "number", "minimum": 0, "maximum": MAX_SLEEP_SECONDS}
            },
            "required": ["seconds"],
            "additionalProperties": False,
        },
        run=_sleep,
        idempotent=True,
        source="builtin",
        timeout=MAX_SLEEP_SECONDS + 60,
    ),
    Tool(
        name="put_note",
        description="Save a note under a key for this session (replaces an existing one).",
        parameters={
            "type": "object",
            "properties": {
                "key": {"type": "string", "minLength": 1, "maxLength": MAX_NOTE_KEY_CHARS},
                # Its bound is checked in the tool: a schema bound this large makes some
                # servers' grammar compilers overflow (llama-cpp-python) when the tool is forced.
                "text": {"type": "string"},
            },
            "required": ["key", "text"],
            "additionalProperties": False,
        },
        run=_put_note,
        idempotent=True,
        source="builtin",
    ),
    Tool(
        name="get_note",
        description="Read the note saved under a key for this session.",
        parameters={
            "type": "object",
            "properties": {
                "key": {"type": "string", "minLength": 1, "maxLength": MAX_NOTE_KEY_CHARS}
            },
            "required": ["key"],
            "additionalProperties": False,
        },
        run=_get_note,
        idempotent=True,
        source="builtin",
    ),
    Tool(
        name="ask_user",
        description="Ask the user a question; the session waits for their answer.",
        parameters={
            "type": "object",
            "properties": {
                "question": {"type": "string", "minLength": 1},
                "options": {"type": "array", "items": {"type": "string"}, "maxItems": 20},
            },
            "required": ["question"],
            "additionalProperties": False,
        },
        run=_ask_user,
        idempotent=True,
        source="builtin",
        ends_turn=True,
    ),
]
