"""The request bodies of the Agent Protocol, as the LangGraph SDKs send them. Fields Ferryman
does not act on are taken and ignored (the SDKs send many as null), unless acting on them
matters: those answer NOT_SERVED where they are read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.api.schemas import JsonObject

MAX_THREAD_PAGE = 1000
MAX_HISTORY = 1000
MAX_INPUT_MESSAGES = 100

StreamModeName = str
MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ThreadCreate(Body):
    thread_id: str | None = None
    metadata: JsonObject | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    supersteps: list[Any] | None = None


class ThreadUpdate(Body):
    metadata: JsonObject | None = None


class ThreadSearch(Body):
    metadata: JsonObject | None = None
    values: dict[str, Any] | None = None
    ids: list[str] | None = Field(default=None, max_length=MAX_THREAD_PAGE)
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(default=10, ge=1, le=MAX_THREAD_PAGE)
    offset: int = Field(default=0, ge=0, le=1_000_000)
    sort_by: (
        Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] | None
    ) = None
    sort_order: Literal["asc", "desc"] | None = None


class ThreadCount(Body):
    metadata: JsonObject | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


class CheckpointRef(Body):
    thread_id: str | None = None
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None


class History(Body):
    """The SDKs' history body; `metadata` and `checkpoint` are taken and not acted on."""

    limit: int = Field(default=10, ge=1, le=MAX_HISTORY)
    # A checkpoint ({checkpoint_id}, or a config {configurable: {checkpoint_id}}), or its id.
    before: dict[str, Any] | str | None = None
    metadata: dict[str, Any] | None = None
    checkpoint: CheckpointRef | None = None


class StateAt(Body):
    checkpoint: CheckpointRef
    subgraphs: bool | None = None


class Command(Body):
    resume: Any = None
    goto: Any = None
    update: Any = None


class RunCreate(Body):
    assistant_id: str = Field(min_length=1, max_length=200)
    input: dict[str, Any] | None = None
    command: Command | None = None
    stream_mode: StreamModeName | list[StreamModeName] | None = None
    # Kept with the run (in the log), bounded as a session's metadata is.
    metadata: JsonObject | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    multitask_strategy: MultitaskStrategy | None = None
    if_not_exists: Literal["create", "reject"] | None = None
    # A stateless run's thread; None is LangGraph's default for one, `delete`.
    on_completion: Literal["delete", "keep"] | None = None
    # Taken: every stream resumes, every step is durable, and there are no subgraphs (so
    # `stream_subgraphs` changes nothing in what streams).
    stream_resumable: bool | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    stream_subgraphs: bool | None = None
    on_disconnect: Literal["cancel", "continue"] | None = None
    checkpoint_id: str | None = None
    checkpoint: dict[str, Any] | None = None
    interrupt_before: Any = None
    interrupt_after: Any = None
    webhook: str | None = None
    after_seconds: float | None = Field(default=None, ge=0)

    def modes(self) -> list[str]:
        if self.stream_mode is None:
            return ["values"]
        return [self.stream_mode] if isinstance(self.stream_mode, str) else self.stream_mode
