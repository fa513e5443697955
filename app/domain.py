"""Words of the contract shared by every layer: statuses, event types, the Session wire shape.

Pure: no I/O, no framework imports, so the store, the API and the runtime all stand on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    IDLE = "idle"  # created without a prompt: no run until its first message
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})
# A user message queues a session in one of these.
REQUEUEABLE = TERMINAL | {Status.WAITING, Status.IDLE}


# Limits of the request bodies (documented in docs/reference.md); the body size limit itself is a
# setting (FERRYMAN_MAX_BODY_BYTES) because proxies in front may impose their own.
MAX_PROMPT_CHARS = 100_000
MAX_MESSAGE_CHARS = 100_000
MAX_TITLE_CHARS = 200
MAX_METADATA_BYTES = 16_384
# Nesting of metadata and tool arguments; deeper JSON could not be echoed in responses.
MAX_JSON_DEPTH = 32
MAX_SCRIPT_TURNS = 200
MAX_TOOLS = 64
# Assistants one session or assistant may delegate to (docs/delegation.md).
MAX_DELEGATES = 16
# Tools a client declares for a session (`clientTools`, AG-UI's `tools`): how many, and their
# declarations together as compact JSON (each schema is sent to the model on every turn).
MAX_CLIENT_TOOLS = 64
MAX_CLIENT_TOOLS_BYTES = 65_536
MAX_INSTRUCTIONS_CHARS = 100_000
# A compaction's `triggerTokens` at least, and `keepRecentTurns` at most (docs/compaction.md).
MIN_COMPACTION_TRIGGER_TOKENS = 100
MAX_KEEP_RECENT_TURNS = 1000
MODEL_NAME_PATTERN = r"^(scripted|(openai|anthropic):[A-Za-z0-9._:/@-]{1,200})$"
MODEL_NAME_RULE = (
    "must be `scripted`, `openai:<model>` or `anthropic:<model>`, where <model> is 1 to 200"
    " letters, digits and . _ : / @ - (for example `openai:gpt-4o-mini`)"
)
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
TOOL_NAME_RULE = "must be a tool name: letters, digits and _ . - only"
MAX_STOP_SEQUENCES = 4
MAX_ASSISTANT_NAME_CHARS = 200
MAX_ASSISTANT_DESCRIPTION_CHARS = 2_000
MAX_ASSISTANTS_PER_OWNER = 1_000
MAX_ASSISTANT_VERSIONS = 1_000
MAX_IDEMPOTENCY_KEY_CHARS = 255
MAX_SCHEDULES_PER_OWNER = 100
# Firings each schedule keeps (and shows as `lastFirings`), newest first.
MAX_SCHEDULE_FIRINGS = 10
DEFAULT_TITLE_CHARS = 80
# A session's claim priority (`priority`, higher first; the column's check in migration 0022).
MIN_PRIORITY = -100
MAX_PRIORITY = 100
# Events a fork copies (its `atSeq`): the copy is one statement, about 8 to 35 µs an event
# (docs/performance.md), kept well inside FERRYMAN_DB_STATEMENT_TIMEOUT's default.
MAX_FORK_EVENTS = 100_000
# Owner ids: API keys are made for them, feeds are keyed by them (`o:<owner>` on the bus, where
# `|` separates an ephemeral frame), so one format everywhere.
OWNER_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


# A log position as clients hold it (the `id` of an event, a cursor): the event's seq or owner
# id, with the epoch of the log it was written in above bit EPOCH_SHIFT (migration 0009: epoch 0
# is the log since Ferryman's schema was made, so there the position is the number itself). A
# standby promoted after asynchronous replication gives the lost events' numbers out again: the
# epoch tells them apart. Below 2^53 for every epoch a smallint can hold, so JavaScript reads
# it exactly.
EPOCH_SHIFT = 40
NUMBER_MASK = (1 << EPOCH_SHIFT) - 1


def position(epoch: int, number: int) -> int:
    """The position of event `number` of a log written in `epoch`."""
    return (epoch << EPOCH_SHIFT) | number


def split_position(pos: int) -> tuple[int, int]:
    """(epoch, number) of a position."""
    return pos >> EPOCH_SHIFT, pos & NUMBER_MASK


def check_owner_id(owner_id: str) -> str:
    """`owner_id` if it has the one owner format; ValueError saying what it must be otherwise."""
    if not OWNER_ID_PATTERN.fullmatch(owner_id):
        raise ValueError(
            f"invalid owner id {owner_id[:40]!r}: 1 to 128 letters, digits and . _ @ -,"
            " starting with a letter or a digit"
        )
    return owner_id


def default_title(prompt: str) -> str:
    """A title for a session created without one: the prompt's first line, shortened."""
    first = prompt.strip().splitlines()[0] if prompt.strip() else "Untitled"
    return first if len(first) <= DEFAULT_TITLE_CHARS else first[: DEFAULT_TITLE_CHARS - 1] + "…"


class Overlap(StrEnum):
    """What a schedule's tick does while the session it fired last has not ended."""

    SKIP = "skip"  # nothing: the tick is recorded as skipped
    QUEUE = "queue"  # one firing waits, and fires once that session has ended
    ALLOW = "allow"  # fires at once, beside it


class OwnerEventType(StrEnum):
    SESSION_CREATED = "session_created"
    SESSION_STATUS = "session_status"
    SESSION_TITLE = "session_title"
    SESSION_ACTIVE_STAGE = "session_active_stage"
    SESSION_CANCEL_REQUESTED = "session_cancel_requested"
    SESSION_RESUMED = "session_resumed"
    SESSION_DELETED = "session_deleted"


class SessionEventType(StrEnum):
    USER_MESSAGE = "user_message"
    SESSION_START = "session_start"
    SESSION_RESUMED = "session_resumed"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_CALL_START = "tool_call_start"
    TOOL_RESULT = "tool_result"
    USER_QUESTION = "user_question"
    MODEL_RETRY = "model_retry"
    MODEL_WAIT = "model_wait"
    TOOL_APPROVAL_REQUESTED = "tool_approval_requested"
    TOOL_APPROVAL_DECIDED = "tool_approval_decided"
    # A call of a client tool: not run by the worker; the session waits for its result.
    CLIENT_TOOL_CALL = "client_tool_call"
    # The result a client posted for one (the API's write; the run answers the call with it).
    CLIENT_TOOL_RESULT = "client_tool_result"
    SESSION_INTERRUPTED = "session_interrupted"
    SESSION_END = "session_end"
    # A summary the model sees instead of the log through `throughSeq` (docs/compaction.md).
    SESSION_COMPACTED = "session_compacted"
    # `POST /compact`: the next run step compacts (the API's write; the run honours it).
    COMPACTION_REQUESTED = "compaction_requested"
    # A call of a delegate (docs/delegation.md): its child session was made with it; the
    # session waits for the child's end.
    DELEGATE_CALL = "delegate_call"
    # A child's end, written by the child's final transaction (the run answers the call with it).
    DELEGATE_RESULT = "delegate_result"


class WebhookEventType(StrEnum):
    """The events a webhook subscription may name (docs/webhooks.md): the log's own type
    names. The triggers of migration 0019 list the same names in their WHEN clauses."""

    SESSION_END = "session_end"
    SESSION_STATUS = "session_status"  # an owner event: every change of a session's status
    TOOL_APPROVAL_REQUESTED = "tool_approval_requested"
    USER_QUESTION = "user_question"


MAX_WEBHOOKS_PER_OWNER = 20
MAX_WEBHOOK_URL_CHARS = 2_048


class SessionErrorCode(StrEnum):
    """`error.code` of a failed session (its `session_end` and the Session's `error`)."""

    MAX_ATTEMPTS_EXCEEDED = "MAX_ATTEMPTS_EXCEEDED"  # its runs kept ending unfinished
    MODEL_BAD_REQUEST = "MODEL_BAD_REQUEST"
    MODEL_AUTH_FAILED = "MODEL_AUTH_FAILED"
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
    MODEL_CONTEXT_TOO_LONG = "MODEL_CONTEXT_TOO_LONG"
    MODEL_REFUSED = "MODEL_REFUSED"  # a content filter or the model's own refusal
    MODEL_ERROR = "MODEL_ERROR"  # a model plug-in failed in a way it did not classify
    MODEL_UNAVAILABLE = "MODEL_UNAVAILABLE"  # retryable faults outlasted the retries


def rfc3339(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with millisecond precision and a `Z` suffix."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def session_view(row: dict[str, Any]) -> dict[str, Any]:
    """The Session object of SPEC section 3, camelCase, from a `sessions` row."""
    lease = None
    if row.get("lease_worker_id"):
        lease = {
            "workerId": row["lease_worker_id"],
            "pid": row["lease_pid"],
            "expiresAt": rfc3339(row["lease_expires_at"]),
        }
    view: dict[str, Any] = {
        "id": str(row["id"]),
        "ownerId": row["owner_id"],
        "title": row["title"],
        "status": row["status"],
        "attempt": row["attempt"],
        "resumes": row["resumes"],
        "model": row["model"],
        "prompt": row["prompt"],
        "activeStage": row["active_stage"],
        "error": row["error"],
        "cancelRequested": row["cancel_requested_at"] is not None,
        "lease": lease,
        "lastSeq": row["last_seq"],
        "createdAt": rfc3339(row["created_at"]),
        "updatedAt": rfc3339(row["updated_at"]),
        "metadata": row["metadata"],
        "instructions": row["instructions"],
        "modelSettings": row["model_settings"],
        "approvalRequired": row["approval_required"] or [],
        "assistant": None
        if row["assistant_id"] is None
        else {"id": str(row["assistant_id"]), "version": row["assistant_version"]},
        "usage": {
            "inputTokens": row["input_tokens"],
            "outputTokens": row["output_tokens"],
            "cachedTokens": row["cached_tokens"],
        },
    }
    if row.get("client_tools") is not None:  # shown only when declared: other sessions as before
        view["clientTools"] = row["client_tools"]
    if row.get("compaction") is not None:
        view["compaction"] = row["compaction"]
    if row.get("forked_from_session_id") is not None:  # shown only on a fork, like clientTools
        view["forkedFrom"] = {
            "sessionId": str(row["forked_from_session_id"]),
            "seq": row["forked_from_seq"],
        }
    if row.get("schedule_id") is not None:  # likewise: only a fired session names its schedule
        view["schedule"] = {
            "id": str(row["schedule_id"]),
            "firedAt": rfc3339(row["schedule_fired_at"]),
        }
    if row.get("delegates") is not None:  # shown only when given (docs/delegation.md)
        view["delegates"] = [d["assistantId"] for d in row["delegates"]]
    if row.get("parent_session_id") is not None:  # a delegate's child
        view["parent"] = {
            "sessionId": str(row["parent_session_id"]),
            "toolCallId": row["parent_tool_call_id"],
        }
    if row.get("priority"):  # shown when not the default 0
        view["priority"] = row["priority"]
    return view


# The fields a listed session carries only the start of (docs/tenants.md "What a tenant sees").
EXCERPTED_FIELDS = ("prompt", "instructions")


def session_summary(row: dict[str, Any], excerpt_chars: int) -> dict[str, Any]:
    """A session as a list shows it: its view with `prompt` and `instructions` cut to
    `excerpt_chars` characters, and `truncated` naming the fields that were cut (GET the
    session for them whole)."""
    view = session_view(row)
    truncated = []
    for name in EXCERPTED_FIELDS:
        text = view[name]
        if text is not None and len(text) > excerpt_chars:
            view[name] = text[:excerpt_chars]
            truncated.append(name)
    view["truncated"] = truncated
    return view


def json_size(value: Any) -> int:
    """The bytes of `value` as an answer's JSON (compact, UTF-8: Starlette's JSONResponse)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


# What a list answer holds besides its items (the envelope, a cursor, a page token), at most.
LIST_ENVELOPE_BYTES = 1024


def within_bytes(sizes: Sequence[int], max_bytes: int) -> int:
    """How many of the leading items (of these JSON sizes) one list answer of at most
    `max_bytes` holds, with their commas and `LIST_ENVELOPE_BYTES` for the rest: the page stops
    before the item that would pass it; at least one item, so every page moves on."""
    used = LIST_ENVELOPE_BYTES
    for count, size in enumerate(sizes):
        used += size + 1
        if used > max_bytes and count > 0:
            return count
    return len(sizes)


def fork_status(last_type: str, last_data: dict[str, Any], edited: bool) -> Status:
    """What a fork starts as, from the last event of the history it copies: `idle` when that
    history ends answered (a final answer, a run that succeeded), so no run starts until a
    message; `queued` otherwise (an edited or unanswered message, a turn or tool call cut
    short, a question), and its first run's resume planning does the rest: it repairs calls
    left without a result, or settles without calling the model."""
    if edited:
        return Status.QUEUED
    final_answer = (
        last_type == SessionEventType.ASSISTANT_MESSAGE
        and not last_data.get("toolCalls")
        and last_data.get("stopReason") == "stop"
    )
    succeeded = last_type == SessionEventType.SESSION_END and last_data.get("status") == "succeeded"
    return Status.IDLE if final_answer or succeeded else Status.QUEUED


def assistant_view(row: dict[str, Any]) -> dict[str, Any]:
    """The Assistant object of SPEC section 8, camelCase, from an assistant joined with one of
    its versions (store/assistants.py); `updatedAt` is when that version was written."""
    view = {
        "id": str(row["id"]),
        "name": row["name"],
        "description": row["description"],
        "model": row["model"],
        "instructions": row["instructions"],
        "modelSettings": row["model_settings"],
        "tools": row["tools"],
        "approvalRequired": row["approval_required"] or [],
        "metadata": row["metadata"],
        "compaction": row.get("compaction"),
        "version": row["version"],
        "createdAt": rfc3339(row["created_at"]),
        "updatedAt": rfc3339(row["updated_at"]),
    }
    # Shown only when set, so assistants without them read as before (docs/delegation.md).
    for key in ("delegates", "script"):
        if row.get(key):
            view[key] = row[key]
    return view


def schedule_view(row: dict[str, Any], firings: list[dict[str, Any]]) -> dict[str, Any]:
    """The Schedule object of SPEC section 12, camelCase, from a `schedules` row and its latest
    `schedule_firings` (each joined with its session's status)."""
    definition = row["definition"]
    return {
        "id": str(row["id"]),
        "ownerId": row["owner_id"],
        "cron": row["cron"],
        "timezone": row["timezone"],
        "enabled": row["enabled"],
        "overlap": row["overlap"],
        "title": row["title"],
        "prompt": row["prompt"],
        "model": definition["model"],
        "instructions": definition["instructions"],
        "modelSettings": definition["model_settings"],
        "tools": definition["tools"],
        "approvalRequired": definition["approval_required"] or [],
        "metadata": definition["metadata"],
        "assistant": None
        if definition["assistant_id"] is None
        else {"id": definition["assistant_id"], "version": definition["assistant_version"]},
        "sessionId": None if row["session_id"] is None else str(row["session_id"]),
        "endTime": rfc3339(row["end_time"]),
        "nextRunAt": rfc3339(row["next_run_at"]),
        "pendingTick": rfc3339(row["pending_tick"]),
        "lastFirings": [_firing_view(f) for f in firings],
        "createdAt": rfc3339(row["created_at"]),
        "updatedAt": rfc3339(row["updated_at"]),
    }


def _firing_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "tick": rfc3339(row["tick"]),
        "at": rfc3339(row["at"]),
        "outcome": row["outcome"],
        "catchUp": row["catch_up"],
        "sessionId": None if row["session_id"] is None else str(row["session_id"]),
        "sessionStatus": row["session_status"],
        "detail": row["detail"],
    }
