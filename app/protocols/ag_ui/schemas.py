"""AG-UI's request body, `RunAgentInput`, as its clients send it (camelCase). What Ferryman
does not act on (`tools`, `context`, `state`) is taken and ignored (docs/ag-ui.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The messages of one input: AG-UI resends the thread's history with each run.
MAX_AG_UI_MESSAGES = 1000
MAX_AG_UI_RESUME_ENTRIES = 100
MAX_AG_UI_ID_CHARS = 200


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ResumeEntry(Body):
    interruptId: str = Field(min_length=1, max_length=MAX_AG_UI_ID_CHARS)
    status: Literal["resolved", "cancelled"]
    payload: Any = None


class RunAgentInput(Body):
    threadId: str = Field(min_length=1, max_length=MAX_AG_UI_ID_CHARS)
    runId: str = Field(min_length=1, max_length=MAX_AG_UI_ID_CHARS)
    messages: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_AG_UI_MESSAGES)
    tools: list[dict[str, Any]] | None = None
    context: list[dict[str, Any]] | None = None
    state: Any = None
    forwardedProps: Any = None
    resume: list[ResumeEntry] | None = Field(default=None, max_length=MAX_AG_UI_RESUME_ENTRIES)
