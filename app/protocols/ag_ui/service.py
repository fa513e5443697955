"""What AG-UI's routes do over sessions: the caller's thread (made on first use), the new user
messages of the history AG-UI resends, resume entries as the answers to pending interrupts,
and a run started as the Agent Protocol starts one (`agent_protocol.service.start_run`: the
same definition rules, the same store writes as the native message and approval endpoints).
SQL stays in store/; this module decides."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from app.domain import MAX_MESSAGE_CHARS, Status
from app.errors import ClientToolNotPending, InputNotSupported, NoPendingInterrupt
from app.protocols.ag_ui.fold import METADATA_KEY, AgUiFold
from app.protocols.ag_ui.schemas import ResumeEntry, RunAgentInput
from app.protocols.agent_protocol import fold
from app.protocols.agent_protocol import service as agent_service
from app.protocols.agent_protocol.schemas import Command, RunCreate
from app.services import Services
from app.store import events as event_store
from app.store import sessions as session_store
from app.streams.frames import session_envelope

# Where app/main.py mounts the protocol.
PREFIX = "/ag-ui"
# The key of `forwardedProps` whose object gives the agent definition (docs/ag-ui.md): the
# Agent Protocol's definition fields (model, script, tools, instructions, modelSettings,
# approvalRequired), checked as a native create body.
DEFINITION_KEY = "ferryman"
# A question's answer when its resume entry is `cancelled`: the agent reads it as any answer.
DECLINED = "(the user declined to answer)"


async def thread_of(
    services: Services, owner: str, assistant_id: str, body: RunAgentInput, priority: int = 0
) -> UUID:
    """The caller's session `body.threadId`, made idle on first use once the definition the
    run gives checks out (so a refused first run leaves no session behind, and the same id
    works when the client tries again). SessionNotFound for an id that is not a UUID; another
    owner's session is no one's to `start_run`."""
    sid = agent_service.parse_thread_id(body.threadId)
    async with services.db.connection() as conn:
        if await session_store.session_row(conn, sid) is not None:
            return sid
    await agent_service.definition_of(services, owner, _run_create(assistant_id, body))
    async with services.db.connection() as conn:
        # None: a concurrent first run made it; whose it is, start_run reads.
        await agent_service.create_idle_thread(
            conn, owner, services, sid, {"protocol": "ag-ui"}, priority
        )
    return sid


async def thread_fold(services: Services, owner: str, sid: UUID) -> tuple[dict[str, Any], AgUiFold]:
    """The session's row and its log folded, in one snapshot."""
    async with services.db.transaction() as conn:
        await session_store.read_one_snapshot(conn)
        row = await session_store.get_session(conn, owner, sid)
        state = AgUiFold(row["id"], model=row["model"])
        async for rows in event_store.session_event_pages(
            conn,
            row["id"],
            int(row["last_seq"]),
            limit=agent_service.LOG_PAGE_ROWS,
            max_bytes=agent_service.LOG_PAGE_BYTES,
        ):
            for event in rows:
                state.apply(session_envelope(event), in_run=False)
    return row, state


def new_user_messages(state: AgUiFold, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The user messages of `messages` the log does not hold yet (`_new`)."""
    return _new(state, messages, "user")


def _new(state: AgUiFold, messages: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    """The messages of `role` in `messages` the log does not hold yet: those after the last
    message whose id it knows (its own ids, and the ids of the messages AG-UI sent before),
    whose ids it does not know."""
    ids = [str(m.get("id")) for m in messages]
    last = max((i for i, mid in enumerate(ids) if mid in state.known), default=-1)
    return [
        m
        for m, mid in zip(messages[last + 1 :], ids[last + 1 :], strict=True)
        if m.get("role") == role and mid not in state.known
    ]


def tool_results(
    state: AgUiFold, messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[agent_service.ToolResultPost]]:
    """The new `tool` messages of `messages` (`_new`) and the results of client tools' calls
    they post: each answers a call that waits for its client's result. One the log holds
    already (the same content posted before) is matched, not posted again; one for a call that
    waits for no result is CLIENT_TOOL_NOT_PENDING (nothing is written)."""
    new = _new(state, messages, "tool")
    posts: list[agent_service.ToolResultPost] = []
    for message in new:
        call_id = str(message.get("toolCallId") or "")
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        if len(text) > MAX_MESSAGE_CHARS:
            raise InputNotSupported(
                f"a tool message's content is over {MAX_MESSAGE_CHARS} characters", "messages"
            )
        result = (call_id, text, bool(message.get("error")))
        if state.client_posted.get(call_id) == result[1:]:
            continue  # posted before (another page, or the native API): the same result
        if call_id not in state.client_calls or call_id in state.client_posted:
            raise ClientToolNotPending(
                f"tool message {message.get('id')!r} answers {call_id!r}, which is no call"
                " waiting for this client's result",
                toolCallId=call_id,
            )
        posts.append(result)
    return new, posts


def resume_answers(
    row: dict[str, Any], state: AgUiFold, entries: list[ResumeEntry]
) -> dict[str, Any]:
    """The Agent Protocol's `command.resume` map (by interrupt id) of AG-UI resume entries."""
    pending = state.pending if row["status"] == Status.WAITING else {}
    unknown = sorted({e.interruptId for e in entries} - set(pending))
    if unknown:
        raise NoPendingInterrupt(
            f"resume names interrupts that are not pending: {', '.join(unknown)}",
            interruptIds=unknown,
        )
    return {e.interruptId: _answer(pending[e.interruptId], e) for e in entries}


def _answer(interrupt: fold.Interrupt, entry: ResumeEntry) -> Any:
    """An approval: approved unless cancelled, a payload of true/false or {approved,
    reason} deciding; a question: its payload's text, DECLINED when cancelled."""
    if interrupt.kind == "approval":
        if entry.status == "cancelled":
            return {"approved": False, "reason": "cancelled"}
        return True if entry.payload is None else entry.payload
    if entry.status == "cancelled":
        return DECLINED
    if entry.payload is None:
        raise InputNotSupported("a resolved question needs its answer as payload", "resume")
    return entry.payload


def _definition(body: RunAgentInput) -> dict[str, Any] | None:
    """The definition fields of `forwardedProps.ferryman`, with the input's `tools` as the
    session's client tools (each run's replace the last's)."""
    props = body.forwardedProps
    given = props.get(DEFINITION_KEY) if isinstance(props, dict) else None
    if given is not None and not isinstance(given, dict):
        raise InputNotSupported(
            f"forwardedProps.{DEFINITION_KEY} must be an object", "forwardedProps"
        )
    if body.tools is None:
        return given
    return {**(given or {}), "clientTools": body.tools}


def _run_create(assistant_id: str, body: RunAgentInput, **more: Any) -> RunCreate:
    return RunCreate(
        assistant_id=assistant_id,
        context=_definition(body),
        multitask_strategy="reject",
        **more,
    )


def lacks_history(state: AgUiFold, body: RunAgentInput) -> bool:
    """Whether the client lacks the thread's history: the log has messages, and its input
    holds none whose id the log knows (a new page on the thread)."""
    return bool(state.messages) and not any(str(m.get("id")) in state.known for m in body.messages)


async def start(
    services: Services, owner: str, assistant_id: str, body: RunAgentInput, priority: int = 0
) -> tuple[dict[str, Any], fold.Run, bool]:
    """Start the run `body` asks for on its thread: its new user messages and its resume
    entries written as the run's first events (a thread with a run in progress: THREAD_BUSY);
    and whether its stream sends the thread's history (`lacks_history`)."""
    sid = await thread_of(services, owner, assistant_id, body, priority)
    row, state = await thread_fold(services, owner, sid)
    new = new_user_messages(state, body.messages)
    tools, posts = tool_results(state, body.messages)
    resume = resume_answers(row, state, body.resume) if body.resume else None
    if not new and resume is None and not posts:
        raise InputNotSupported(
            "a run needs a user message the thread does not have yet in `messages`, a `tool`"
            " message with the result of a call of a client tool, or `resume` entries for its"
            " pending interrupts",
            "messages",
        )
    messages = [{"role": "user", "content": m.get("content")} for m in new]
    run = _run_create(
        assistant_id,
        body,
        input={"messages": messages} if new else None,
        command=Command(resume=resume) if resume is not None else None,
        metadata={
            METADATA_KEY: {
                "runId": body.runId,
                "messageIds": [str(m.get("id")) for m in (*tools, *new)],
            }
        },
    )
    row, opened = await agent_service.start_run(services, owner, sid, run, posts)
    return row, opened, lacks_history(state, body)
