"""What the Agent Protocol's routes do over sessions: threads and their state from the log,
runs started by messages, decisions and resumes, and waits for a run's end. SQL stays in
store/; this module decides."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import NAMESPACE_URL, UUID, uuid5

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from app.api import schemas as native
from app.api import sessions as native_sessions
from app.api.definitions import resolve_session
from app.api.deps import Caller
from app.api.sessions import _wait_terminal
from app.api.webhooks import new_secret
from app.db.pool import Connection
from app.domain import MAX_MESSAGE_CHARS, TERMINAL, Status, default_title, rfc3339
from app.errors import (
    InputNotSupported,
    NoPendingInterrupt,
    NotFound,
    NotServed,
    RunNotFound,
    SessionAlreadyTerminal,
    SessionNotFound,
    ThreadBusy,
)
from app.protocols.agent_protocol import fold
from app.protocols.agent_protocol.schemas import RunCreate
from app.services import Services
from app.store import events as event_store
from app.store import sessions as session_store
from app.store import threads as thread_store
from app.store import webhooks as webhook_store
from app.store.notify import session_key
from app.store.sessions import NewSession
from app.streams.frames import session_envelope
from app.webhooks.targets import allowed_hosts, check_url

# Where app/main.py mounts the protocol.
PREFIX = "/agent-protocol"
# The one graph Ferryman serves: its agent loop (docs/langgraph.md).
GRAPH_ID = "ferryman"
# The default assistant's id (assistants.py): a run naming it runs the graph, like GRAPH_ID.
DEFAULT_ASSISTANT_ID = uuid5(NAMESPACE_URL, "urn:ferryman:assistant:ferryman")
BUSY = frozenset({Status.QUEUED, Status.RUNNING})
# The agent definition a run's `context` (or `config.configurable`) may carry: the create
# body's fields of the native API, and the NewSession field each gives.
DEFINITION_FIELDS = {
    "model": "model",
    "script": "script",
    "tools": "tools",
    "instructions": "instructions",
    "modelSettings": "model_settings",
    "approvalRequired": "approval_required",
    "clientTools": "client_tools",
    "compaction": "compaction",
}
# A wait for a run's end looks at the log at least this often, in case a notification is lost.
RUN_WAIT_POLL = 1.0
LOG_PAGE_ROWS = 1000
LOG_PAGE_BYTES = 4 * 1_048_576
# A stateless run's thread is deleted once the run ended unless its create said
# `on_completion: keep`; its metadata says which, so the delete outlives the API process.
STATELESS = {"stateless": True}
# A thread to delete whose run ended this long ago is deleted by the retention pass (its own
# API process restarted, or held too many deletes already), so many in one pass.
STATELESS_DELETE_GRACE = timedelta(minutes=1)
STATELESS_SWEEP_ROWS = 1000
# A background wait for a thread to settle looks this often, from the first to the last.
SETTLE_POLL_FIRST = 0.25
SETTLE_POLL_LAST = 5.0


def parse_thread_id(raw: str) -> UUID:
    try:
        return UUID(raw)
    except ValueError:
        raise SessionNotFound() from None


def thread_status(row: dict[str, Any]) -> str:
    return fold.THREAD_STATUS.get(row["status"], "idle")


async def load_fold(
    conn: Connection, row: dict[str, Any], run: str | None = None
) -> fold.ThreadFold:
    """The thread's state folded from its whole log, as of `row` (read in this transaction)."""
    state = fold.ThreadFold(row["id"], model=row["model"], run=run)
    async for rows in event_store.session_event_pages(
        conn, row["id"], int(row["last_seq"]), limit=LOG_PAGE_ROWS, max_bytes=LOG_PAGE_BYTES
    ):
        for event in rows:
            state.apply(session_envelope(event), in_run=False)
    return state


async def owned_thread(services: Services, owner: str, thread_id: str) -> dict[str, Any]:
    """The caller's thread (SessionNotFound for anyone else's)."""
    async with services.db.connection() as conn:
        return await session_store.get_session(conn, owner, parse_thread_id(thread_id))


async def thread_and_fold(
    services: Services, owner: str, thread_id: str
) -> tuple[dict[str, Any], fold.ThreadFold]:
    async with services.db.transaction() as conn:
        await session_store.read_one_snapshot(conn)
        row = await session_store.get_session(conn, owner, parse_thread_id(thread_id))
        return row, await load_fold(conn, row)


def thread_view(row: dict[str, Any], state: fold.ThreadFold | None) -> dict[str, Any]:
    interrupts: dict[str, list[dict[str, Any]]] = {}
    head = state.head() if state else None
    if state is not None and head is not None and state.pending and row["status"] == Status.WAITING:
        interrupts[_task_id(state, head)] = [i.view() for i in state.pending.values()]
    return {
        "thread_id": str(row["id"]),
        "created_at": rfc3339(row["created_at"]),
        "updated_at": rfc3339(row["updated_at"]),
        "state_updated_at": rfc3339(row["updated_at"]),
        "metadata": row["metadata"],
        "status": thread_status(row),
        "values": state.values() if state is not None else None,
        "interrupts": interrupts,
        "config": {},
        "error": row["error"],
    }


def _task_id(state: fold.ThreadFold, point: fold.Checkpoint) -> str:
    return fold.derived(state.session_id, "task", point.seq)


def _checkpoint_ref(thread_id: str, point: fold.Checkpoint | None) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "checkpoint_ns": "",
        "checkpoint_id": fold.checkpoint_id(point.seq) if point else None,
        "checkpoint_map": None,
    }


def state_view(
    row: dict[str, Any], state: fold.ThreadFold, point: fold.Checkpoint | None
) -> dict[str, Any]:
    """The thread's state at checkpoint `point` (its newest: `state.head()`)."""
    thread_id = str(row["id"])
    newest = point is not None and point is state.head()
    busy = newest and row["status"] in BUSY
    interrupts = list(point.interrupts) if point else []
    if newest and row["status"] != Status.WAITING:
        interrupts = []
    tasks = []
    if point is not None and (busy or interrupts):
        tasks.append(
            {
                "id": _task_id(state, point),
                "name": fold._NODE,
                "path": [],
                "error": None,
                "interrupts": [i.view() for i in interrupts],
                "checkpoint": None,
                "state": None,
                "result": None,
            }
        )
    parent = None
    if point is not None and point.step > 0:
        parent = _checkpoint_ref(thread_id, state.checkpoints[point.step - 1])
    values = state.values(point) if point is not None else {"messages": []}
    if point is not None and not interrupts:
        values.pop("__interrupt__", None)
    return {
        "values": values,
        "next": [fold._NODE] if tasks else [],
        "tasks": tasks,
        "checkpoint": _checkpoint_ref(thread_id, point),
        "metadata": {
            "step": point.step if point else -1,
            "source": "loop" if point and point.step else "input",
            "thread_id": thread_id,
            "seq": point.seq if point else 0,
        },
        "created_at": point.created_at if point else rfc3339(row["created_at"]),
        "parent_checkpoint": parent,
        "interrupts": [i.view() for i in interrupts],
    }


def checkpoint_at(state: fold.ThreadFold, checkpoint: str | None) -> fold.Checkpoint | None:
    """The checkpoint an id names (NotFound for one this thread never had)."""
    if checkpoint is None:
        return state.head()
    seq = fold.checkpoint_seq(checkpoint)
    for point in state.checkpoints:
        if point.seq == seq:
            return point
    raise NotFound("no such checkpoint on this thread")


def history(
    row: dict[str, Any], state: fold.ThreadFold, limit: int, before: str | None
) -> list[dict[str, Any]]:
    points = state.checkpoints
    if before is not None:
        seq = fold.checkpoint_seq(before)
        if seq is None:
            raise NotFound("no such checkpoint on this thread")
        points = [p for p in points if p.seq < seq]
    return [state_view(row, state, p) for p in reversed(points[-limit:])]


async def create_idle_thread(
    conn: Connection,
    caller: Caller,
    services: Services,
    sid: UUID,
    metadata: dict[str, Any],
) -> dict[str, Any] | None:
    """A new idle session of the caller (no event until its first run) with the id `sid`, at
    the caller's priority; None when a session with that id exists, whoever's it is."""
    return await session_store.create_idle_session(
        conn,
        caller.owner,
        sid,
        "New thread",
        services.settings.model,
        {**metadata, "graph_id": GRAPH_ID},
        caller.key_id,
        caller.priority,
    )


def stateless_metadata(on_completion: str | None) -> dict[str, Any]:
    if on_completion in (None, "delete"):
        return dict(thread_store.STATELESS_TO_DELETE)
    return {**STATELESS, "on_completion": on_completion}


async def delete_thread(services: Services, owner: str, thread_id: UUID) -> None:
    """The native delete (a busy session is cancelled first), unless it is gone already."""
    with contextlib.suppress(SessionNotFound):
        await native_sessions.delete_session(str(thread_id), owner, services)


async def wait_settled(services: Services, owner: str, thread_id: UUID) -> None:
    """Until the thread has no run in progress. It polls, more slowly as it waits, and takes
    no notification: a background wait may lag a poll, but must not read at every token."""
    poll = SETTLE_POLL_FIRST
    while (await owned_thread(services, owner, str(thread_id)))["status"] in BUSY:
        await asyncio.sleep(poll)
        poll = min(2 * poll, SETTLE_POLL_LAST)


async def delete_ended_stateless(services: Services) -> int:
    """Delete the stateless threads left to delete (`on_completion: delete`) whose run has
    ended: the retention pass's share, for an API process that did not live to do it."""
    async with services.db.connection() as conn:
        rows = await thread_store.ended_stateless(
            conn, STATELESS_DELETE_GRACE, STATELESS_SWEEP_ROWS
        )
    for row in rows:
        await delete_thread(services, row["owner_id"], row["id"])
    return len(rows)


# --- runs ------------------------------------------------------------------------------------


async def runs_of_thread(conn: Connection, row: dict[str, Any]) -> list[fold.Run]:
    marks = await thread_store.run_marks(conn, row["id"])
    return fold.runs_of(row["id"], marks, row["status"])


async def find_run(
    services: Services, owner: str, thread_id: str, run_id: str
) -> tuple[dict[str, Any], fold.Run]:
    async with services.db.transaction() as conn:
        await session_store.read_one_snapshot(conn)
        row = await session_store.get_session(conn, owner, parse_thread_id(thread_id))
        for run in await runs_of_thread(conn, row):
            if run.id == run_id:
                return row, run
    raise RunNotFound()


def run_view(row: dict[str, Any], run: fold.Run, assistant_id: str = GRAPH_ID) -> dict[str, Any]:
    return {
        "run_id": run.id,
        "thread_id": str(row["id"]),
        "assistant_id": assistant_id,
        "created_at": rfc3339(run.created_at),
        "updated_at": rfc3339(run.updated_at),
        "status": run.status,
        # The run create's metadata (its keys win), and where in the log the run lies.
        "metadata": {"start_seq": run.start_seq, "end_seq": run.end_seq, **(run.metadata or {})},
        # A run not started here (a native message) is one that messages join: enqueue.
        "multitask_strategy": run.multitask_strategy or "enqueue",
        "kwargs": {},
    }


def check_served(body: RunCreate, stateless: bool) -> None:
    """Refuse, before anything is written, what a run create asks that Ferryman cannot do
    (NOT_SERVED, saying what to use instead): each is a value other than the default."""
    if body.interrupt_before or body.interrupt_after:
        raise NotServed(
            "interrupt_before and interrupt_after: Ferryman's agent has no graph nodes to stop"
            " at; have tool calls wait for approval (approvalRequired in the run's context), or"
            " let the agent ask (ask_user)"
        )
    if body.after_seconds:
        raise NotServed(
            "after_seconds: a delayed start is not served; create the run when it is due, or"
            " give it a timetable with a cron (crons.create)"
        )
    if stateless and requested_checkpoint(body) is not None:
        raise NotServed(
            "checkpoint_id of a stateless run: its new thread has no checkpoint; run on the"
            " thread that has it"
        )


def check_webhook(services: Services, body: RunCreate) -> None:
    """A run's `webhook` must be a URL a subscription may name (422 WEBHOOK_TARGET_REFUSED),
    checked before anything is written."""
    if body.webhook is not None:
        check_url(body.webhook, allowed_hosts(services.settings.webhook_allow_hosts))


async def subscribe_webhook(
    services: Services, owner: str, thread_id: UUID, run: fold.Run, body: RunCreate
) -> None:
    """The run's `webhook`: a one-off subscription, delivered once when the run ends."""
    if body.webhook is None:
        return
    async with services.db.transaction() as conn:
        await webhook_store.create_one_off(
            conn, owner, thread_id, run.start_seq, body.webhook, new_secret()
        )


async def run_webhook_body(
    conn: Connection, row: dict[str, Any] | None, session_id: UUID, start_seq: int, event: Any
) -> dict[str, Any]:
    """What a run's webhook delivers, as LangGraph's servers send it: the run (as
    `runs.get` answers it) with `status`, `run_started_at`, `run_ended_at`, `webhook_sent_at`,
    the thread's `values` as the run left them, and `error` when it failed. `row`: the
    session, None once purged (then only what the end event says)."""
    end = event.get("data") or {}
    ended_at = event.get("createdAt")
    status = fold.RUN_STATUS.get(Status(end.get("status", "failed")), "error")
    body: dict[str, Any] = {
        "run_id": fold.run_id(session_id, start_seq),
        "thread_id": str(session_id),
        "assistant_id": GRAPH_ID,
        "status": status,
        "metadata": {},
        "run_started_at": None,
        "values": None,
    }
    if row is not None:
        for run in await runs_of_thread(conn, row):
            if run.start_seq == start_seq:
                assistant = str(row["assistant_id"]) if row["assistant_id"] else GRAPH_ID
                body.update(run_view(row, run, assistant), status=status)
                body["run_started_at"] = rfc3339(run.created_at)
        state = await load_fold(conn, row)
        upto = [p for p in state.checkpoints if p.seq <= int(event.get("seq") or 0)]
        body["values"] = state.values(upto[-1]) if upto else {"messages": []}
    body["run_ended_at"] = rfc3339(datetime.fromisoformat(ended_at)) if ended_at else None
    body["webhook_sent_at"] = rfc3339(datetime.now(UTC))
    if end.get("error"):
        body["error"] = end["error"]
    return body


def requested_checkpoint(body: RunCreate) -> str | None:
    """The checkpoint a run create names (`checkpoint_id`, or `checkpoint.checkpoint_id`)."""
    named = (body.checkpoint or {}).get("checkpoint_id")
    return body.checkpoint_id or (str(named) if named else None)


async def check_checkpoint(
    services: Services, owner: str, thread_id: UUID, body: RunCreate
) -> None:
    """A run starts from the thread's newest checkpoint: naming any other is NOT_SERVED (a
    run from an earlier state is a fork of the session). Read only when one is named; a run
    that lands after the check starts after it as any run would."""
    wanted = requested_checkpoint(body)
    if wanted is None:
        return
    _, state = await thread_and_fold(services, owner, str(thread_id))
    head = state.head()
    seq = fold.checkpoint_seq(wanted)
    if head is not None and seq == head.seq:
        return
    known = seq is not None and any(p.seq == seq for p in state.checkpoints)
    at = f" {{atSeq: {seq}}}" if known else ""
    raise NotServed(
        "checkpoint_id: a run starts from the thread's newest checkpoint only (the log is"
        f" append-only); running from an earlier one will be a fork of the session"
        f" (POST /api/agent/{thread_id}/fork{at}, not served yet), then a run on the new thread"
    )


def opening_data(body: RunCreate, strategy: str) -> dict[str, Any]:
    """What the event that opens a run keeps of its create (`fold.runs_of` reads it back)."""
    data: dict[str, Any] = {"multitaskStrategy": strategy}
    if body.metadata:
        data["runMetadata"] = body.metadata
    return data


def input_texts(body: RunCreate) -> list[str]:
    """The user messages a run's `input` holds: human text only (INPUT_NOT_SUPPORTED else)."""
    if body.input is None:
        return []
    unknown = set(body.input) - {"messages"}
    if unknown:
        raise InputNotSupported(
            f"input may hold only `messages`, not {', '.join(sorted(unknown))}: Ferryman's "
            "agent has no other state"
        )
    messages = body.input.get("messages") or []
    if isinstance(messages, dict | str):
        messages = [messages]
    if not isinstance(messages, list) or len(messages) > 100:
        raise InputNotSupported(
            "input.messages must be a list of at most 100 messages", "input.messages"
        )
    return [_human_text(message, i) for i, message in enumerate(messages)]


def _human_text(message: Any, index: int) -> str:
    where = f"input.messages[{index}]"
    role: Any
    content: Any
    if isinstance(message, str):
        role, content = "human", message
    elif isinstance(message, list) and len(message) == 2:
        role, content = message
    elif isinstance(message, dict):
        role = message.get("role") or message.get("type") or "human"
        content = message.get("content")
    else:
        raise InputNotSupported(f"{where} is not a message", where)
    if role not in ("human", "user"):
        raise InputNotSupported(
            f"{where} is a {role!r} message: only human messages can be sent (the agent"
            " writes its own ai and tool messages)"
        )
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        if len(parts) != len(content) or any(p.get("type") != "text" for p in parts):
            raise InputNotSupported(f"{where}.content: only text parts can be sent", where)
        content = "".join(str(p.get("text", "")) for p in parts)
    if not isinstance(content, str) or not content or len(content) > MAX_MESSAGE_CHARS:
        raise InputNotSupported(
            f"{where}.content must be text of 1 to {MAX_MESSAGE_CHARS} characters"
        )
    return content


async def definition_of(
    services: Services, caller: Caller, body: RunCreate
) -> tuple[NewSession, frozenset[str]]:
    """The agent definition a run gives its thread: the assistant's (a stored one by its id,
    pinned as the native API pins it; none for the graph id), overridden by what the run's
    `config.configurable` and `context` carry, checked as a native create body; and the
    fields of NewSession those carry."""
    given: dict[str, Any] = {}
    configurable = (body.config or {}).get("configurable") or {}
    for source in (configurable, body.context or {}):
        given.update({k: v for k, v in source.items() if k in DEFINITION_FIELDS})
    named = frozenset(DEFINITION_FIELDS[k] for k in given)
    if body.assistant_id not in (GRAPH_ID, str(DEFAULT_ASSISTANT_ID)):
        given["assistantId"] = body.assistant_id
    try:
        create = native.CreateSession.model_validate(given)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", "context", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors) from None
    return await resolve_session(services, caller, create), named


# The columns of a session's agent definition, by the NewSession field each one stores.
_DEFINITION_COLUMNS = {
    "model": "model",
    "script": "script",
    "tools": "tools",
    "instructions": "instructions",
    "model_settings": "model_settings",
    "approval_required": "approval_required",
    "assistant_id": "assistant_id",
    "assistant_version": "assistant_version",
    "client_tools": "client_tools",
    "compaction": "compaction",
    "delegates": "delegates",
}


def _redefinition(row: dict[str, Any], new: NewSession, named: frozenset[str]) -> NewSession | None:
    """The definition a later run gives its thread: all of `new` when the run named another
    stored assistant than the thread's, else the session's with the fields its context
    `named` taken from `new` (so a run naming the thread's assistant keeps the version the
    thread pinned); None when that changes nothing."""
    if new.assistant_id is not None and new.assistant_id != row["assistant_id"]:
        named = frozenset(_DEFINITION_COLUMNS)
    kept = {f: row[c] for f, c in _DEFINITION_COLUMNS.items() if f not in named}
    changed = replace(new, **kept)
    if all(getattr(changed, f) == row[c] for f, c in _DEFINITION_COLUMNS.items()):
        return None
    return changed


async def start_run(
    services: Services,
    caller: Caller,
    thread_id: UUID,
    body: RunCreate,
    tool_results: Sequence[ToolResultPost] = (),
) -> tuple[dict[str, Any], fold.Run]:
    """Write what starts (or joins) a run: decisions and answers for `command.resume`, the
    results of client tools' calls (AG-UI's `tool` messages), then the input's messages; the
    run is the one that holds the first event written."""
    owner = caller.owner
    if body.command is not None and (
        body.command.goto is not None or body.command.update is not None
    ):
        raise InputNotSupported(
            "command.goto and command.update have no Ferryman counterpart", "command"
        )
    resume = body.command.resume if body.command is not None else None
    texts = input_texts(body)
    if not texts and resume is None and not tool_results:
        raise InputNotSupported("a run needs input.messages or command.resume")
    strategy = body.multitask_strategy or "reject"
    if strategy == "rollback":
        raise NotServed(
            "multitask_strategy rollback: Ferryman's log is append-only, a run's events cannot"
            " be dropped; use interrupt"
        )
    # Checked before any lock is taken: the assistant, and the definition a first run gives.
    definition, in_context = await definition_of(services, caller, body)
    if strategy == "interrupt":
        async with services.db.transaction() as conn:
            row = await session_store.get_session(conn, owner, thread_id, for_update=True)
            if row["status"] in BUSY:
                with contextlib.suppress(SessionAlreadyTerminal):
                    await session_store.request_cancel(conn, owner, thread_id)
        if row["status"] in BUSY:
            await _wait_terminal(services, owner, thread_id, services.settings.cancel_wait_seconds)
    named = replace(definition, title=default_title(texts[0] if texts else "resume"))
    opening = opening_data(body, strategy)
    if resume is None and len(texts) == 1 and not tool_results:
        # The common case, a thread's first run with one message, is one statement: no
        # transaction.
        async with services.db.connection() as conn:
            fresh = await thread_store.start_first_run(
                conn, owner, thread_id, named, texts[0], opening
            )
        if fresh is not None:
            return fresh, _opened(thread_id, 1, body, strategy)
    async with services.db.transaction() as conn:
        # A thread's first run gives it its definition and its first message, which also
        # locks its row; any other run locks the row as it is.
        fresh = None
        if resume is None and len(texts) > 1:
            fresh = await thread_store.start_first_run(
                conn, owner, thread_id, named, texts[0], opening
            )
        row = fresh or await session_store.get_session(conn, owner, thread_id, for_update=True)
        # No run open: what is written now opens one (`fold.runs_of`).
        opens = fresh is not None or row["status"] not in BUSY
        if not opens and strategy == "reject":
            raise ThreadBusy(
                "the thread has a run in progress (multitask_strategy reject)",
                threadStatus="busy",
            )
        redefined = None if fresh is not None else _redefinition(row, definition, in_context)
        if redefined is not None:
            # A later run with another assistant or definition runs with it from now on.
            if not opens:
                raise ThreadBusy(
                    "a run with another assistant or definition starts only when the thread"
                    " has no run in progress (multitask_strategy interrupt cancels it first)",
                    threadStatus="busy",
                )
            row = await thread_store.redefine(conn, thread_id, redefined)
        first: int | None = 1 if fresh is not None else None
        if resume is not None:
            first = await _answer(conn, services, caller, row, resume, opening)
        for result in tool_results:
            event, _, _ = await session_store.post_client_result(
                conn, owner, thread_id, *result, extra=opening if first is None else None
            )
            first = first or int(event["seq"])
        for text in texts[1:] if fresh is not None else texts:
            locked = row if first is None else None  # the row changes with each message
            extra = opening if first is None else None  # the first event opens the run
            event, _ = await session_store.post_message(
                conn, owner, thread_id, text, locked=locked, extra=extra
            )
            first = first or int(event["seq"])
        assert first is not None
        if opens:
            return row, _opened(thread_id, first, body, strategy)
        for run in await runs_of_thread(conn, row):
            if run.start_seq <= first and (run.end_seq is None or first <= run.end_seq):
                return row, run
    raise RunNotFound()


# A client tool's result as a run posts it: (toolCallId, content, isError).
ToolResultPost = tuple[str, str, bool]


def _opened(thread_id: UUID, first: int, body: RunCreate, strategy: str) -> fold.Run:
    """The run that the event at seq `first` opened, as it starts."""
    now = datetime.now(UTC)
    run_id = fold.run_id(thread_id, first)
    return fold.Run(run_id, first, None, "pending", now, now, body.metadata or None, strategy)


async def _answer(
    conn: Connection,
    services: Services,
    caller: Caller,
    row: dict[str, Any],
    resume: Any,
    opening: dict[str, Any],
) -> int:
    """Answer the thread's pending interrupts with `resume` (one value for all, or a map by
    interrupt id): a question with a user message, an approval with its decision (the same
    store function the native approval endpoint calls). The seq of the first event written,
    which keeps `opening` in its data. A decision is refused as the native endpoint refuses it
    (FERRYMAN_APPROVAL_SEPARATE)."""
    owner = caller.owner
    state = await load_fold(conn, row)
    pending = state.pending if row["status"] == Status.WAITING else {}
    if not pending:
        raise NoPendingInterrupt("the thread has no pending interrupt to resume")
    if isinstance(resume, dict) and resume and set(resume) <= set(pending):
        answers = [(pending[k], v) for k, v in resume.items()]
    elif isinstance(resume, dict) and any(k in pending for k in resume):
        raise NoPendingInterrupt("the resume map names interrupts that are not pending")
    else:
        answers = [(interrupt, resume) for interrupt in pending.values()]
    first: int | None = None
    question = None
    for interrupt, value in sorted(answers, key=lambda a: a[0].kind != "approval"):
        if interrupt.kind == "approval":
            approved, reason = _decision(value)
            native_sessions.check_separate(services, caller, row)
            assert interrupt.tool_call_id is not None
            event, _ = await session_store.decide_approval(
                conn,
                owner,
                row["id"],
                interrupt.tool_call_id,
                approved,
                reason,
                extra=opening if first is None else None,
            )
            first = first or int(event["seq"])
        else:
            question = value
    if question is not None:
        text = _answer_text(question)
        extra = opening if first is None else None
        event, _ = await session_store.post_message(conn, owner, row["id"], text, extra=extra)
        first = first or int(event["seq"])
    assert first is not None
    return first


def _answer_text(value: Any) -> str:
    if isinstance(value, dict):
        for key in ("text", "answer", "content"):
            if isinstance(value.get(key), str):
                value = value[key]
                break
    text = value if isinstance(value, str) else json.dumps(value)
    if not text or len(text) > MAX_MESSAGE_CHARS:
        raise InputNotSupported(
            f"command.resume must be 1 to {MAX_MESSAGE_CHARS} characters", "command.resume"
        )
    return text


_YES = frozenset({"approve", "approved", "accept", "yes", "y", "true", "allow"})


def _decision(value: Any) -> tuple[bool, str | None]:
    """(approved, reason) of a resume value for an approval: a bool, a word, or an object
    with `approved` (or `type: accept`) and maybe `reason`."""
    if isinstance(value, bool):
        return value, None
    if isinstance(value, str):
        return value.strip().lower() in _YES, None
    if isinstance(value, dict):
        approved = value.get("approved")
        if approved is None:
            approved = str(value.get("type", "")).lower() in _YES
        reason = value.get("reason") or value.get("message")
        return bool(approved), str(reason) if reason is not None else None
    raise InputNotSupported(
        "command.resume for an approval must be true/false, a word such as approve, or"
        " {approved, reason?}"
    )


async def wait_run_end(
    services: Services, owner: str, thread_id: UUID, run_id: str
) -> tuple[dict[str, Any], fold.Run]:
    """The run once it has ended (the client's disconnect cancels the wait)."""
    changed = asyncio.Event()
    with services.bus.subscribe(session_key(thread_id), lambda _: changed.set()):
        while True:
            changed.clear()
            row, run = await find_run(services, owner, str(thread_id), run_id)
            if run.end_seq is not None:
                return row, run
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), RUN_WAIT_POLL)


async def cancel_run(
    services: Services, owner: str, thread_id: UUID, run: fold.Run, wait: bool
) -> None:
    if run.end_seq is not None:
        return
    async with services.db.transaction() as conn:
        row = await session_store.get_session(conn, owner, thread_id, for_update=True)
        if Status(row["status"]) not in TERMINAL:
            await session_store.request_cancel(conn, owner, thread_id)
    if wait:
        await wait_run_end(services, owner, thread_id, run.id)
