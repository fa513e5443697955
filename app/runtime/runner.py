"""One run of one session under one lease: plan, repair, then model turns and tool calls until
the model stops, every step written through the fenced log."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar
from uuid import UUID, uuid4

from prometheus_client import Counter

from app import tracing
from app.agent import delegation
from app.agent.approvals import (
    Approval,
    ClientResult,
    record_approval_event,
    record_client_result,
    settle,
    settle_client,
)
from app.agent.compaction import (
    DEFAULT_INSTRUCTIONS,
    CompactionSettings,
    choose_cut,
    compact,
    estimate_tokens,
    model_view,
    summary_prompt,
    transcript,
    trim_results,
)
from app.agent.conversation import (
    AssistantMessage,
    Message,
    Summary,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
    bounded_reply,
    bounded_result,
    clip_text,
    conversation_from_events,
    message_from_event,
)
from app.agent.models import (
    Model,
    ModelFault,
    ModelRequest,
    ModelSettings,
    Providers,
    RetryPolicy,
    ToolSpec,
)
from app.agent.models.redact import redact_provider_text
from app.agent.resume import ResumePlan, plan_resume, repair
from app.agent.tools import Tool, ToolContext, ToolError, ToolRegistry
from app.db.pool import Database
from app.domain import OwnerEventType, SessionErrorCode, SessionEventType, Status
from app.errors import FenceRefused
from app.runtime.budgets import ProviderBudgets, Ticket
from app.runtime.deltas import DeltaHub
from app.runtime.writes import RunWrites
from app.scopes import child_scope_problem
from app.store import delegation as delegation_store
from app.store import events as event_store
from app.store import keys as key_store
from app.store import sessions as session_store
from app.store import settling
from app.store.events import Fence, fence_errors
from app.store.run_writes import Batch, Write, get_note, send_batch

log = logging.getLogger(__name__)

T = TypeVar("T")
AbortReason = Literal["cancelled", "lease_lost", "shutdown"]

RUNS = Counter("ferryman_runs_total", "Runs ended, by outcome", ["outcome"])
RESUMES = Counter("ferryman_resumes_total", "Runs that continued existing history", ["reason"])
REPAIRED = Counter("ferryman_repaired_tool_calls_total", "Tool calls answered by repair")
MODEL_RETRIES = Counter("ferryman_model_retries_total", "Model calls retried, by fault", ["reason"])
MODEL_TOKENS = Counter(
    "ferryman_model_tokens", "Tokens reported by model providers", ["model", "kind"]
)


class RunAborted(Exception):
    def __init__(self, reason: AbortReason) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class RunContext:
    """What a run needs from its worker."""

    db: Database
    registry: ToolRegistry
    worker_id: str
    pid: int
    tool_timeout: float
    providers: Providers
    retry: RetryPolicy
    # Bytes of model text or tool output one event may hold (FERRYMAN_MAX_EVENT_BYTES), and of
    # events one read of the log may return (FERRYMAN_TRANSCRIPT_PAGE_BYTES).
    max_event_bytes: int
    read_page_bytes: int
    # The worker's token deltas, sent together.
    deltas: DeltaHub
    # The worker's run writes, sent together.
    writes: RunWrites
    # Tool results are shown to the model cut to this (FERRYMAN_MODEL_TOOL_RESULT_MAX_CHARS).
    tool_result_max_chars: int = 50_000
    # A session this many delegations deep is offered no delegates (FERRYMAN_MAX_AGENT_DEPTH).
    max_agent_depth: int = 3
    # The provider budgets shared by every worker (docs/budgets.md); None: none configured.
    budgets: ProviderBudgets | None = None


@dataclass
class Run:
    ctx: RunContext
    row: dict[str, Any]
    abort_event: asyncio.Event = field(default_factory=asyncio.Event)
    abort_reason: AbortReason | None = None
    conversation: list[Message] = field(default_factory=list)
    # How far this run has read the log for follow-ups: its own writes must not move it, or a
    # message logged while a tool ran would be skipped (and marked delivered).
    read_seq: int = 0
    # (name, arguments) of non-idempotent calls a crash interrupted: not re-run automatically.
    not_rerun: set[tuple[str, str]] = field(default_factory=set)
    # Approvals requested in this session, by call id, and the calls waiting on them.
    approvals: dict[str, Approval] = field(default_factory=dict)
    awaiting: list[ToolCall] = field(default_factory=list)
    # The tools this session may use, by name.
    tools: dict[str, Tool] = field(default_factory=dict)
    # The tools the session's client declared, by name: offered to the model, never run here;
    # their calls wait for the client's result (posted as `client_tool_result`).
    client_tools: dict[str, Tool] = field(default_factory=dict)
    client_calls: list[ToolCall] = field(default_factory=list)
    client_results: dict[str, ClientResult] = field(default_factory=dict)
    # The session's delegates as tools (docs/delegation.md), by tool name, with the assistant
    # each names; the calls waiting for their child's end, and the ends logged so far.
    delegate_tools: dict[str, Tool] = field(default_factory=dict)
    delegate_ids: dict[str, str] = field(default_factory=dict)
    delegated: list[ToolCall] = field(default_factory=list)
    child_ends: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Writes that need not be durable before the run's next step that waits or acts (a model
    # call, a tool): they go with the next write, so a turn costs one statement, not one per
    # event. Every path from a write to such a step passes `flush()` or `finish()`.
    pending: Batch = field(default_factory=Batch)
    # Whether a message or an approval decision may have been logged since the run last read
    # its log (the inbox notification; `ended` sets it too, for one that was lost).
    inbox: bool = False
    # The seq of the last event the run wrote (committed): a token delta says which event it
    # follows (`afterSeq`), so streams keep them in order.
    written_seq: int = 0
    # Messages of the conversation written with the pending writes, by their event's index
    # there: their seq is known once the write commits (`flush`), and a compaction's cut needs
    # it (`throughSeq`).
    unsequenced: list[tuple[int, Message]] = field(default_factory=list)
    # A `compaction_requested` not honoured yet (POST /compact).
    compaction_asked: bool = False
    # The session's last `session_end` when the run was queued by POST /compact alone (no
    # message, decision or result since): once compacted, the run settles as that end did.
    settle_as: dict[str, Any] | None = None

    @property
    def session_id(self) -> UUID:
        session_id: UUID = self.row["id"]
        return session_id

    @property
    def fence(self) -> Fence:
        return Fence(self.ctx.worker_id, self.row["attempt"])

    def abort(self, reason: AbortReason) -> None:
        # Lease loss outranks cancel and shutdown: after it, nothing more may be written.
        if self.abort_reason is None or reason == "lease_lost":
            self.abort_reason = reason
        self.abort_event.set()

    def check(self) -> None:
        if self.abort_reason is not None:
            raise RunAborted(self.abort_reason)

    async def interruptible(self, step: Awaitable[T]) -> T:
        """Run a model call or a tool until it ends or the run is aborted, whichever is first."""
        task = asyncio.ensure_future(step)
        aborted = asyncio.ensure_future(self.abort_event.wait())
        try:
            await asyncio.wait({task, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert self.abort_reason is not None
        raise RunAborted(self.abort_reason)

    # --- durable writes -------------------------------------------------------------------

    async def flush(self) -> None:
        """Make the pending writes (with other runs' of the worker, `RunWrites`)."""
        if not self.pending:
            return
        self.flushed(await self.ctx.writes.send(Write(self.fence, self.session_id, self.pending)))

    def flushed(self, row: dict[str, Any] | None) -> None:
        """The pending writes are committed, with their messages' seqs."""
        if row is not None and row["seq"] is not None:
            self.sequence(int(row["seq"]) - len(self.pending.events) + 1)
        self.written(row)

    def sequence(self, first_seq: int) -> None:
        """Give the conversation's messages just written the seqs of their events. (A message
        written with a run's end that found a follow-up keeps seq 0: no cut passes it.)"""
        stamped = {id(m): replace(m, seq=first_seq + i) for i, m in self.unsequenced}
        if stamped:
            self.conversation = [stamped.get(id(m), m) for m in self.conversation]

    def defer_message(self, type_: str, message: Message, data: dict[str, Any]) -> None:
        """Log a message of the conversation with the run's next write."""
        self.unsequenced.append((len(self.pending.events), message))
        self.defer(type_, data)

    def written(self, row: dict[str, Any] | None) -> None:
        """The pending writes are committed (`row`: their statement's, from `send_batch`)."""
        self.pending = Batch()
        self.unsequenced = []
        if row is not None and row["seq"] is not None:
            self.written_seq = max(self.written_seq, int(row["seq"]))

    def log_end(self) -> int:
        """The last seq of the log this run knows of: the claim's, or what it wrote or read."""
        return max(int(self.row["last_seq"]), self.written_seq, self.read_seq)

    def defer(self, type_: str, data: dict[str, Any]) -> None:
        """Log an event with the run's next write."""
        self.pending.add(type_, data)

    async def append(self, type_: str, data: dict[str, Any]) -> None:
        self.defer(type_, data)
        await self.flush()

    async def finish(self, status: Status, **details: Any) -> bool:
        """End the run with the pending writes; False when a follow-up arrived that the model
        has not seen yet: the run goes on to answer it instead (the pending writes made)."""
        # A cancel was requested, or a child's end answers its parent: `settling.finish`.
        child = self.row.get("parent_session_id") is not None
        if status == Status.WAITING or (status != Status.CANCELLED and not child):
            at_once = settling.at_once(
                self.fence, self.row, status, self.pending, self.log_end(), **details
            )
            row = await self.ctx.writes.send(at_once)
            if row is not None and row["written"]:
                self.written(row)
                return self.ended(status)
        with fence_errors():
            async with self.ctx.db.pipeline() as conn:
                settled, sent = await settling.finish(
                    conn, self.fence, self.row, status, self.pending, **details
                )
        self.written(await sent.fetchone())  # received already: no round trip
        return self.ended(settled)

    def ended(self, settled: Status | None) -> bool:
        if settled is None:
            log.info("run goes on: a follow-up arrived", extra={"session": str(self.session_id)})
            self.inbox = True
            return False
        RUNS.labels(str(settled)).inc()
        tracing.run_ended(str(settled))
        log.info("run ended", extra={"session": str(self.session_id), "status": str(settled)})
        return True

    # --- the loop ---------------------------------------------------------------------------

    async def execute(self) -> None:
        try:
            plan = await self.begin()
            if self.compaction_asked:  # POST /compact on a waiting or finished session
                await self.compact_with(self.row["model"], self.specs(), force=True)
            if self.settle_as is not None and await self.settle_as_before(self.settle_as):
                return
            if plan.kind == "already-complete":
                outcome = Status.WAITING if plan.outcome == "waiting" else Status.SUCCEEDED
                if await self.finish(outcome):
                    return
            try:
                model = self.ctx.providers.model(self.row["model"], self.row["script"])
            except ModelFault as fault:
                await self.fail(fault, self.read_seq)
                return
            await self.loop(model)
        except RunAborted as aborted:
            await self.on_abort(aborted.reason)
        except FenceRefused:
            RUNS.labels("lease_lost").inc()
            self.log_lease_lost()

    async def begin(self) -> ResumePlan:
        # The log is read in pages bounded in bytes: what the run keeps is the conversation
        # (events are cut to FERRYMAN_MAX_EVENT_BYTES when written), not every row at once.
        messages: list[Message] = []
        started: set[str] = set()
        requested: set[str] = set()  # calls of client tools
        delegated: set[str] = set()  # calls of delegates
        last_run_event: dict[str, Any] | None = None  # tells whether and how a run ended
        async for rows in self.read_log():
            messages.extend(conversation_from_events(rows))
            for row in rows:
                record_approval_event(self.approvals, row["type"], row["data"])
                record_client_result(self.client_results, row["type"], row["data"])
                if row["type"] == SessionEventType.TOOL_CALL_START:
                    started.add(str(row["data"]["toolCallId"]))
                if row["type"] == SessionEventType.CLIENT_TOOL_CALL:
                    requested.add(str(row["data"]["toolCallId"]))
                if row["type"] == SessionEventType.DELEGATE_CALL:
                    delegated.add(str(row["data"]["toolCallId"]))
                self.record_child_end(row["type"], row["data"])
                self.note_compaction(row["type"])
                self.note_end(row)
                if row["type"] in _RUN_EVENTS:
                    last_run_event = row
            self.read_seq = int(rows[-1]["seq"])
        if not self.compaction_asked:
            self.settle_as = None
        history = undelivered_last(model_view(messages), self.row["delivered_seq"])
        plan = plan_resume(
            history,
            self.ctx.registry.turn_enders(),
            approvals=self.approvals,
            started=started,
            client_calls=requested | delegated,
        )
        self.conversation = list(plan.conversation)
        self.awaiting = [c for c in plan.awaiting if c.id not in requested | delegated]
        self.client_calls = [c for c in plan.awaiting if c.id in requested]
        self.delegated = [c for c in plan.awaiting if c.id in delegated]
        self.tools = {tool.name: tool for tool in self.ctx.registry.select(self.row["tools"])}
        self.client_tools = {
            tool.name: tool
            for tool in client_tools(self.row.get("client_tools"))
            if tool.name not in self.tools
        }
        self.offer_delegates()
        self.not_rerun = self.interrupted_side_effects(plan)
        # The run's start goes with its first write (before the model is first asked), unless
        # the claim logged it (a session's first).
        for repaired in plan.repairs:
            self.defer_message(SessionEventType.TOOL_RESULT, repaired, repaired.wire())
        run_info = {
            "workerId": self.ctx.worker_id,
            "pid": self.ctx.pid,
            "attempt": self.row["attempt"],
        }
        if last_run_event is None:
            self.defer(SessionEventType.SESSION_START, run_info)
        elif _started_by_claim(last_run_event, self.row["attempt"]):
            self.written_seq = int(last_run_event["seq"])
        else:
            reason = resume_reason([last_run_event])
            resumed = {
                **run_info,
                "reason": reason,
                "transcriptMessages": len(self.conversation),
                "repairedToolCalls": plan.repaired_tool_calls,
            }
            self.defer(SessionEventType.SESSION_RESUMED, resumed)
            # The run taken over (or followed up) held the claim before this one's.
            tracing.link_run(self.session_id, self.row["attempt"] - 1, reason)
            self.pending.announce(OwnerEventType.SESSION_RESUMED, resumed)
            RESUMES.labels(reason).inc()
            REPAIRED.inc(len(plan.repairs))
            log.info(
                "session resumed",
                extra={
                    "session": str(self.session_id),
                    "plan": plan.kind,
                    "reason": reason,
                    "repaired": plan.repaired_tool_calls,
                    "stripped": plan.stripped,
                },
            )
        return plan

    async def read_log(self) -> AsyncIterator[list[dict[str, Any]]]:
        """The log up to the claim's `last_seq`, page by page: the head the claim brought when
        it reaches that far (a new session's whole log), else read outside any transaction
        (the lease fences every run write, so nothing a run wrote can change under the read;
        messages logged since come through the inbox). A cancel requested in the instant
        between the claim and the worker's listening for it is seen by the next heartbeat."""
        last_seq = int(self.row["last_seq"])
        head = self.row.get("head") or []
        if head and int(head[-1]["seq"]) == last_seq:
            yield head
            return
        async with self.ctx.db.connection() as conn:
            async for rows in event_store.session_event_pages(
                conn, self.session_id, last_seq, limit=1000, max_bytes=self.ctx.read_page_bytes
            ):
                yield rows

    def specs(self) -> tuple[ToolSpec, ...]:
        return (
            *(tool.spec() for tool in self.tools.values()),
            *(tool.spec() for tool in self.client_tools.values()),
            *(tool.spec() for tool in self.delegate_tools.values()),
        )

    async def loop(self, model: Model) -> None:
        specs = self.specs()
        settings = ModelSettings.from_wire(self.row["model_settings"])
        while True:
            self.check()
            await self.take_new_events()
            if self.awaiting or self.client_calls or self.delegated:
                if await self.settle_awaiting():
                    return
                if self.awaiting or self.client_calls or self.delegated:
                    continue  # a follow-up, a decision or a result came in as the run was to wait
            await self.flush()  # what the model is told is durable before it is asked
            await self.compact_if_due(specs)  # which may take new messages
            delivered = self.read_seq
            try:
                reply = bounded_reply(
                    await self.call_model(model, self.request(specs, settings)),
                    self.ctx.max_event_bytes,
                )
            except ModelFault as fault:
                if fault.kind != "context_too_long" or not await self.compact_with(
                    self.row["model"], specs, force=True
                ):
                    await self.fail(fault, delivered)
                    return
                delivered = self.read_seq
                try:  # once, on the compacted conversation; then the fault is the session's
                    reply = bounded_reply(
                        await self.call_model(model, self.request(specs, settings)),
                        self.ctx.max_event_bytes,
                    )
                except ModelFault as again:
                    await self.fail(again, delivered)
                    return
            # Logged with what the reply leads to: its tool calls' start, or the run's end.
            self.log_reply(reply, delivered)
            self.count_tokens(reply.usage)
            self.conversation.append(reply)
            if reply.stop_reason == "error":
                message = redact_provider_text(reply.text)  # a provider's words, as a fault's
                error = {"code": SessionErrorCode.MODEL_ERROR, "message": message}
                await self.finish(Status.FAILED, error=error)
                return
            if reply.tool_calls:
                self.ask_client(reply.tool_calls)
                await self.delegate(reply.tool_calls)
                ours = [
                    c
                    for c in reply.tool_calls
                    if c.name not in self.client_tools and c.name not in self.delegate_tools
                ]
                self.awaiting = [c for c in ours if self.requires_approval(c)]
                now = [c for c in ours if not self.requires_approval(c)]
                asked = await self.run_calls(now)
                waits = self.awaiting or self.client_calls or self.delegated
                if asked and not waits and await self.finish(Status.WAITING):
                    return
                continue
            if reply.stop_reason == "length":
                ended = await self.finish(
                    Status.WAITING, note="output limit reached; send a message to continue"
                )
            else:
                ended = await self.finish(Status.SUCCEEDED)
            if ended:
                return

    def shown(self, conversation: list[Message] | None = None) -> list[Message]:
        """The conversation as the model is shown it: each tool result cut to
        FERRYMAN_MODEL_TOOL_RESULT_MAX_CHARS."""
        return trim_results(
            self.conversation if conversation is None else conversation,
            self.ctx.tool_result_max_chars,
        )

    def request(self, specs: tuple[ToolSpec, ...], settings: ModelSettings) -> ModelRequest:
        """What the model is asked: the conversation (compacted, if it was), its tool results
        cut, and every tool still offered."""
        return ModelRequest(tuple(self.shown()), specs, self.row["instructions"], settings)

    # --- compaction (docs/compaction.md) --------------------------------------------------

    def compaction(self) -> CompactionSettings:
        """The session's compaction, or the defaults (for POST /compact and a provider's
        context-too-long answer, which compact any session)."""
        configured = CompactionSettings.from_wire(self.row.get("compaction"))
        return configured or CompactionSettings(trigger_tokens=0)

    def note_end(self, row: dict[str, Any]) -> None:
        if row["type"] == SessionEventType.SESSION_END:
            self.settle_as = dict(row["data"])
        elif row["type"] in _INPUTS:
            self.settle_as = None

    def note_compaction(self, type_: str) -> None:
        if type_ == SessionEventType.COMPACTION_REQUESTED:
            self.compaction_asked = True
        elif type_ == SessionEventType.SESSION_COMPACTED:
            self.compaction_asked = False

    async def compact_if_due(self, specs: tuple[ToolSpec, ...]) -> None:
        """Compact before a model call that was asked for one, or whose request would pass
        the trigger."""
        configured = CompactionSettings.from_wire(self.row.get("compaction"))
        due = configured is not None and (
            estimate_tokens(self.shown(), self.row["instructions"], specs)
            > configured.trigger_tokens
        )
        if due or self.compaction_asked:
            await self.compact_with(self.row["model"], specs, force=self.compaction_asked)

    async def compact_with(
        self, session_model: str, specs: tuple[ToolSpec, ...], *, force: bool
    ) -> bool:
        """One compaction: a model call writes the summary of the conversation's head, logged
        as `session_compacted` in one fenced write (a crash before it leaves the previous
        view whole: the next run compacts again). False when nothing could be cut or the
        summary could not be had (the run goes on with the conversation as it was)."""
        settings = self.compaction()
        # Every message logged so far is taken (one logged later has a seq past the cut), and
        # every message's seq known.
        self.inbox = True
        await self.take_new_events()
        await self.flush()
        held = {c.id for c in (*self.awaiting, *self.client_calls, *self.delegated)}
        self.compaction_asked = False
        view = self.conversation
        cut = choose_cut(view, settings.keep_recent_turns, held)
        if cut is None:
            log.info("nothing to compact", extra={"session": str(self.session_id), "forced": force})
            return False
        covered = tuple(view[:cut])
        name = settings.model or session_model
        instructions = self.row["instructions"]
        # The transcript the summarizer reads is bounded by the trigger (or what it replaces).
        budget = max(settings.trigger_tokens, 1000) * 4
        request = ModelRequest(
            (UserMessage(summary_prompt(transcript(covered, budget))),),
            (),
            settings.instructions or DEFAULT_INSTRUCTIONS,
            compacting=covered,
        )
        try:
            summarizer = self.ctx.providers.model(name, self.row["script"])
            reply = await self.call_model(summarizer, request, streamed=False, name=name)
        except ModelFault as fault:
            log.warning(
                "compaction failed (%s): going on uncompacted",
                fault.kind,
                extra={"session": str(self.session_id)},
            )
            return False
        text = clip_text(reply.text, self.ctx.max_event_bytes - 1024).strip()
        if not text:
            log.warning("compaction wrote no summary", extra={"session": str(self.session_id)})
            return False
        through = max(m.seq for m in covered if not isinstance(m, Summary))
        after = compact(view, Summary(text, through))
        data: dict[str, Any] = {
            "throughSeq": through,
            "summary": text,
            "tokensBefore": estimate_tokens(self.shown(view), instructions, specs),
            "tokensAfter": estimate_tokens(self.shown(after), instructions, specs),
            "model": name,
        }
        if reply.usage is not None:
            data["usage"] = reply.usage.wire()
            usage = reply.usage
            self.pending.count_tokens(usage.input_tokens, usage.output_tokens, usage.cached_tokens)
            self.count_tokens(usage, name)
        await self.append(SessionEventType.SESSION_COMPACTED, data)
        summary = after[0]
        assert isinstance(summary, Summary)
        self.conversation = [replace(summary, seq=self.written_seq), *after[1:]]
        log.info(
            "session compacted",
            extra={"session": str(self.session_id), "throughSeq": through, "forced": force},
        )
        return True

    def log_reply(self, reply: AssistantMessage, delivered: int) -> None:
        self.defer_message(SessionEventType.ASSISTANT_MESSAGE, reply, reply.wire())
        self.pending.deliver(delivered)
        if reply.usage is not None:
            usage = reply.usage
            self.pending.count_tokens(usage.input_tokens, usage.output_tokens, usage.cached_tokens)

    async def settle_as_before(self, end: dict[str, Any]) -> bool:
        """A run queued by POST /compact alone ends as the session's previous run did (a turn
        cut by the output limit is not taken up again); False when a follow-up came meanwhile."""
        self.pending.deliver(self.read_seq)
        note = end.get("note")
        return await self.finish(Status(end["status"]), **({"note": note} if note else {}))

    def requires_approval(self, call: ToolCall) -> bool:
        tool = self.tools.get(call.name)
        if tool is None:
            return False  # answered "unknown tool" at once
        return tool.requires_approval or call.name in (self.row["approval_required"] or ())

    async def run_calls(self, calls: Iterable[ToolCall]) -> bool:
        """Run calls in order; True when one of them asked the user a question."""
        asked = False
        for call in calls:
            tool = self.tools.get(call.name)
            result = await self.call_tool(call, tool)
            self.conversation.append(result)
            if tool is not None and tool.ends_turn and not result.is_error:
                self.defer(SessionEventType.USER_QUESTION, _question(call.arguments))
                asked = True
        return asked

    def ask_client(self, calls: Iterable[ToolCall]) -> None:
        """The calls of client tools wait for their client (logged with the reply, so durable
        with it); one whose arguments its schema refuses is answered with the error at once,
        as a server tool's would be, and never reaches the client."""
        self.client_calls = []
        for call in calls:
            tool = self.client_tools.get(call.name)
            if tool is None:
                continue
            problem = argument_problem(call, tool)
            if problem is not None:
                result = ToolResult(call.id, call.name, problem, is_error=True)
                self.defer_message(SessionEventType.TOOL_RESULT, result, result.wire())
                self.conversation.append(result)
                continue
            self.defer(SessionEventType.CLIENT_TOOL_CALL, _call_data(call))
            self.client_calls.append(call)

    # --- delegation (docs/delegation.md) ---------------------------------------------------

    def offer_delegates(self) -> None:
        """The session's delegates as tools the model may call, unless it is as deep as
        FERRYMAN_MAX_AGENT_DEPTH allows (then it is offered none)."""
        depth = int(self.row.get("depth") or 0)
        if not delegation.offers_delegates(depth, self.ctx.max_agent_depth):
            return
        for entry in self.row.get("delegates") or ():
            name = str(entry["tool"])
            if name in self.tools or name in self.client_tools:
                continue
            self.delegate_ids[name] = str(entry["assistantId"])
            self.delegate_tools[name] = Tool(
                name,
                str(entry.get("description") or ""),
                delegation.TASK_PARAMETERS,
                _run_by_client,
                source="delegate",
            )

    def record_child_end(self, type_: str, data: dict[str, Any]) -> None:
        if type_ == SessionEventType.DELEGATE_RESULT:
            self.child_ends.setdefault(str(data["toolCallId"]), data)

    async def delegate(self, calls: Iterable[ToolCall]) -> None:
        """Make a child session for each delegate call, in the transaction that logs the
        reply and the calls (`delegate_call`): a call is logged with its child or not at
        all, so a resumed run never makes a second one. A call whose arguments do not fit,
        or whose assistant is gone, is answered with the error at once."""
        children: list[tuple[ToolCall, session_store.NewSession, UUID]] = []
        for call in calls:
            tool = self.delegate_tools.get(call.name)
            if tool is None:
                continue
            problem = argument_problem(call, tool)
            new = None
            if problem is None:
                async with self.ctx.db.connection() as conn:
                    new = await delegation_store.child_session(
                        conn,
                        self.row,
                        self.delegate_ids[call.name],
                        call.id,
                        str(call.arguments["task"]),
                    )
                if new is None:
                    problem = "the assistant this tool delegates to no longer exists"
                elif new.created_by_key_id is not None:
                    async with self.ctx.db.connection() as conn:
                        policy = await key_store.policy_of(conn, new.created_by_key_id)
                    problem = child_scope_problem(policy, new.tools, new.model)
            if problem is not None or new is None:
                result = ToolResult(call.id, call.name, str(problem), is_error=True)
                self.defer_message(SessionEventType.TOOL_RESULT, result, result.wire())
                self.conversation.append(result)
                continue
            child_id = uuid4()
            data = {**_call_data(call), "assistantId": self.delegate_ids[call.name]}
            self.defer(SessionEventType.DELEGATE_CALL, {**data, "childSessionId": str(child_id)})
            children.append((call, new, child_id))
        if not children:
            return
        with fence_errors():
            async with self.ctx.db.pipeline() as conn:
                sent = await send_batch(conn, self.fence, self.session_id, self.pending)
                for _, new, child_id in children:
                    await session_store.create_session(
                        conn, self.row["owner_id"], new, None, session_id=child_id
                    )
        self.flushed(await sent.fetchone())  # received already: no round trip
        self.delegated.extend(call for call, _, _ in children)

    def settle_delegated(self) -> None:
        """Answer the delegate calls whose child ended, with its answer or its failure."""
        waiting: list[ToolCall] = []
        for call in self.delegated:
            end = self.child_ends.get(call.id)
            if end is None:
                waiting.append(call)
                continue
            result = delegation.child_result(
                call.id, call.name, str(end["status"]), end.get("answer"), end.get("error")
            )
            result = bounded_result(result, self.ctx.max_event_bytes)
            self.defer_message(SessionEventType.TOOL_RESULT, result, result.wire())
            self.conversation.append(result)
        self.delegated = waiting

    async def settle_awaiting(self) -> bool:
        """Act on the decisions about calls that wait for approval: run the approved ones,
        answer the denied ones; answer the client calls whose result came; True when the run
        ended (to wait for a person or a client)."""
        answered, still = settle_client(self.conversation, self.client_calls, self.client_results)
        for result in answered:
            result = bounded_result(result, self.ctx.max_event_bytes)
            posted = result.tool_call_id in self.client_results
            # `client`: the client holds this result already (AG-UI does not send it back).
            wire = {**result.wire(), "client": True} if posted else result.wire()
            self.defer_message(SessionEventType.TOOL_RESULT, result, wire)
            self.conversation.append(result)
        self.client_calls = list(still)
        self.settle_delegated()
        settlement = settle(self.conversation, self.awaiting, self.approvals)
        for result in settlement.denied:
            self.defer_message(SessionEventType.TOOL_RESULT, result, result.wire())
            self.conversation.append(result)
        asked = await self.run_calls(settlement.run)
        self.awaiting = list(settlement.pending)
        # Results in call order, after their call, whatever order they were decided in.
        held = {c.id for c in (*self.awaiting, *self.client_calls, *self.delegated)}
        self.conversation = repair(self.conversation, held)[0]
        if self.awaiting or self.client_calls or self.delegated:
            return await self.wait_for_approval()
        return asked and await self.finish(Status.WAITING)

    async def wait_for_approval(self) -> bool:
        """Ask for the approvals not asked for yet and end the run `waiting`, in one
        transaction, so a decision (or a client's result) always finds the session waiting.
        False when a follow-up, a decision or a result arrived meanwhile: the run goes on to
        take it."""
        for call in self.awaiting:
            if call.id not in self.approvals:
                self.defer(SessionEventType.TOOL_APPROVAL_REQUESTED, _call_data(call))
                self.approvals[call.id] = Approval(call.id)
        # Everything read so far is taken: the decisions, and no message (one would have
        # denied what is pending).
        self.pending.deliver(self.read_seq)
        return await self.finish(Status.WAITING)

    async def take_new_events(self) -> None:
        """Take follow-ups (steering), approval decisions and client tools' results logged
        since we last looked."""
        if not self.inbox:
            return
        self.inbox = False  # before the read: a notification during it means another read
        async with self.ctx.db.connection() as conn:
            rows = await event_store.read_session_events(conn, self.session_id, self.read_seq, 1000)
        for row in rows:
            message = message_from_event(row["type"], row["data"], int(row["seq"]))
            if row["type"] == SessionEventType.USER_MESSAGE and message is not None:
                self.conversation.append(message)
            record_approval_event(self.approvals, row["type"], row["data"])
            record_client_result(self.client_results, row["type"], row["data"])
            self.record_child_end(row["type"], row["data"])
            self.note_compaction(row["type"])
            self.read_seq = max(self.read_seq, int(row["seq"]))

    async def call_model(
        self,
        model: Model,
        request: ModelRequest,
        *,
        streamed: bool = True,
        name: str | None = None,
    ) -> AssistantMessage:
        """One turn, retrying the provider's transient faults with backoff; each retry is
        logged (`model_retry`) so clients drop the partial text they were shown. Not
        `streamed` (a compaction's summary): its text goes to no client. A call of a provider
        with a budget (`name`: the model it calls, by default the session's) waits for it
        first (`model_wait`), and a 429 pauses the provider for every worker."""
        budgets = self.ctx.budgets
        key = budgets.key_for(name or self.row["model"]) if budgets is not None else None
        for retry in itertools.count(1):
            ticket = None
            if key is not None:
                assert budgets is not None
                ticket = await budgets.acquire(key, self.model_wait, self.interruptible)
            try:
                reply = await self.stream_turn(model, request, streamed)
            except ModelFault as fault:
                if not fault.retryable or not self.ctx.retry.allows(retry):
                    await self.give_back(ticket, fault)
                    raise
                delay = self.ctx.retry.delay(retry, fault.retry_after)
                await self.give_back(ticket, fault, delay)
                MODEL_RETRIES.labels(fault.kind).inc()
                log.warning(
                    "model call failed (%s); retry %d in %.1f s",
                    fault.kind,
                    retry,
                    delay,
                    extra={"session": str(self.session_id)},
                )
                retry_event = {
                    "attempt": retry,
                    "delayMs": round(delay * 1000),
                    "reason": fault.kind,
                    "message": fault.message,
                }
                await self.append(SessionEventType.MODEL_RETRY, retry_event)
                tracing.retried(retry, delay, fault.kind, fault.message)
                await self.interruptible(asyncio.sleep(delay))
                continue
            except BaseException:
                await self.give_back(ticket)
                raise
            used = reply.usage.input_tokens + reply.usage.output_tokens if reply.usage else 0
            await self.give_back(ticket, used_tokens=used)
            return reply
        raise AssertionError("unreachable")

    async def model_wait(self, reason: str, until: float | None) -> None:
        """The run waits on a provider budget: said on the session's stream (fenced)."""
        data: dict[str, Any] = {"reason": reason}
        if until is not None:
            data["untilMs"] = round(until * 1000)
        await self.append(SessionEventType.MODEL_WAIT, data)

    async def give_back(
        self,
        ticket: Ticket | None,
        fault: ModelFault | None = None,
        delay: float | None = None,
        *,
        used_tokens: int = 0,
    ) -> None:
        """A budgeted call ended: its slot back, its tokens counted; a 429 pauses the provider
        for every worker, for its Retry-After or else the retry's delay."""
        if ticket is None or self.ctx.budgets is None:
            return
        pause = None
        if fault is not None and fault.kind == "rate_limited":
            pause = fault.retry_after if fault.retry_after is not None else delay
        try:
            await self.ctx.budgets.release(ticket, used_tokens=used_tokens, pause=pause)
        except Exception:  # the slot expires by itself a lease TTL on
            log.warning("giving back a budget slot failed", exc_info=True)

    async def stream_turn(
        self, model: Model, request: ModelRequest, shown: bool = True
    ) -> AssistantMessage:
        streamed: list[str] = []

        async def on_delta(text: str) -> None:
            streamed.append(text)
            if shown:
                self.ctx.deltas.add(self.session_id, self.row["owner_id"], text, self.written_seq)

        try:
            return await self.interruptible(model.complete(request, on_delta))
        except RunAborted as aborted:
            await self.defer_deltas()
            if aborted.reason == "cancelled" and shown:
                # Keep what the user already saw, marked aborted (resume planning drops it).
                partial = AssistantMessage("".join(streamed), (), "aborted")
                await self.append(SessionEventType.ASSISTANT_MESSAGE, partial.wire())
            raise
        except ModelFault:
            raise
        except Exception as exc:  # a model plug-in failing must not crash the worker
            log.exception("model failed", extra={"session": str(self.session_id)})
            raise ModelFault("internal", f"the model failed: {type(exc).__name__}: {exc}") from exc
        finally:
            await self.defer_deltas()

    async def defer_deltas(self) -> None:
        """The turn's text not sent yet goes out with the run's next transaction, before the
        event that ends the turn: deltas still precede their message, and a short turn costs
        no NOTIFY of its own."""
        line = await self.ctx.deltas.take(self.session_id)
        if line is not None:
            self.pending.ephemerals.append(line)

    async def fail(self, fault: ModelFault, delivered: int) -> None:
        """End the run `failed` for a model fault: recorded as a failure, never as words of
        the model's. The messages up to `delivered` were tried, so they do not re-queue it."""
        code = fault.code
        message = fault.message
        if fault.retryable:
            code = SessionErrorCode.MODEL_UNAVAILABLE
            message = f"{message} (gave up after {self.ctx.retry.max_retries} retries)"
        self.pending.deliver(delivered)
        await self.finish(Status.FAILED, error={"code": code, "message": message})

    def count_tokens(self, usage: Usage | None, model: str | None = None) -> None:
        if usage is None:
            return
        model = model or self.row["model"]
        MODEL_TOKENS.labels(model, "input").inc(usage.input_tokens)
        MODEL_TOKENS.labels(model, "output").inc(usage.output_tokens)
        MODEL_TOKENS.labels(model, "cached").inc(usage.cached_tokens)

    async def call_tool(self, call: ToolCall, tool: Tool | None) -> ToolResult:
        self.check()
        stage = f"tool:{call.name}"
        start = {"toolCallId": call.id, "name": call.name, "arguments": call.arguments}
        self.defer(SessionEventType.TOOL_CALL_START, start)
        self.pending.set_stage(stage)
        self.pending.announce(OwnerEventType.SESSION_ACTIVE_STAGE, {"stage": stage})
        await self.flush()  # durable before the tool runs
        try:
            with tracing.execute_tool(call, tool):
                result = bounded_result(await self.run_tool(call, tool), self.ctx.max_event_bytes)
                tracing.tool_result(result)
        except RunAborted as aborted:
            if aborted.reason == "cancelled":
                cancelled = ToolResult(call.id, call.name, "cancelled by the user", True, True)
                self.defer(SessionEventType.TOOL_RESULT, cancelled.wire())  # with the run's end
            raise
        # Written with the next tool's start, or before the next model call.
        self.defer_message(SessionEventType.TOOL_RESULT, result, result.wire())
        return result

    def interrupted_side_effects(self, plan: ResumePlan) -> set[tuple[str, str]]:
        repaired = set(plan.repaired_tool_calls)
        calls = [
            call
            for message in plan.conversation
            if isinstance(message, AssistantMessage)
            for call in message.tool_calls
            if call.id in repaired
        ]
        return {
            _call_key(call)
            for call in calls
            if (tool := self.ctx.registry.get(call.name)) is not None and not tool.idempotent
        }

    async def run_tool(self, call: ToolCall, tool: Tool | None) -> ToolResult:
        if tool is None:
            return ToolResult(call.id, call.name, f"unknown tool {call.name!r}", is_error=True)
        if not tool.idempotent and _call_key(call) in self.not_rerun:
            # The same call replayed right after a crash: it may already have taken effect.
            self.not_rerun.discard(_call_key(call))
            return ToolResult(call.id, call.name, NOT_RERUN_CONTENT, is_error=True)
        problem = argument_problem(call, tool)
        if problem is not None:
            return ToolResult(call.id, call.name, problem, is_error=True)
        timeout = tool.timeout if tool.timeout is not None else self.ctx.tool_timeout
        context = ToolContext(
            session_id=self.session_id,
            call_id=call.id,
            idempotency_key=f"{self.session_id}:{call.id}",
            attempt=self.row["attempt"],
            notes=RunNotes(self),
        )
        try:
            content = await self.interruptible(
                asyncio.wait_for(tool.run(call.arguments, context), timeout)
            )
        except RunAborted:
            raise
        except TimeoutError:
            return ToolResult(
                call.id,
                call.name,
                f"the tool exceeded its {timeout:g} s budget",
                is_error=True,
                timed_out=True,
            )
        except ToolError as exc:
            return ToolResult(call.id, call.name, str(exc), is_error=True)
        except Exception as exc:
            return ToolResult(call.id, call.name, f"{type(exc).__name__}: {exc}", is_error=True)
        return ToolResult(call.id, call.name, str(content))

    async def on_abort(self, reason: AbortReason) -> None:
        RUNS.labels(reason).inc()
        tracing.run_ended(reason)
        try:
            if reason == "cancelled":
                await self.finish(Status.CANCELLED)
            elif reason == "shutdown":
                with fence_errors():
                    async with self.ctx.db.pipeline() as conn:
                        sent = await settling.release(
                            conn, self.fence, self.row, "shutdown", self.pending
                        )
                self.written(await sent.fetchone())  # received already: no round trip
            elif reason == "lease_lost":
                self.log_lease_lost()
        except FenceRefused:
            self.log_lease_lost()  # the lease went meanwhile: nothing more to write

    def log_lease_lost(self) -> None:
        """Said once by every run that is fenced out, however it learnt (a refused write, or a
        heartbeat that found the lease gone): after this line it writes nothing."""
        log.warning("lease lost; run stops writing", extra={"session": str(self.session_id)})


NOT_RERUN_CONTENT = (
    "not run again: an earlier identical call of this non-idempotent tool was interrupted by a "
    "worker crash and may have taken effect; check its effect, then call it again to retry"
)


def _call_key(call: ToolCall) -> tuple[str, str]:
    return call.name, json.dumps(call.arguments, sort_keys=True)


# Events only a run writes: the last of them tells whether the previous run closed.
_RUN_EVENTS = frozenset(
    {
        SessionEventType.SESSION_START,
        SessionEventType.SESSION_RESUMED,
        SessionEventType.ASSISTANT_MESSAGE,
        SessionEventType.SESSION_END,
        SessionEventType.SESSION_INTERRUPTED,
        SessionEventType.TOOL_CALL_START,
        SessionEventType.TOOL_RESULT,
        SessionEventType.MODEL_RETRY,
        SessionEventType.USER_QUESTION,
        SessionEventType.CLIENT_TOOL_CALL,
        SessionEventType.SESSION_COMPACTED,
        SessionEventType.DELEGATE_CALL,
    }
)


# What the API logs for a run to act on: a session queued by none of them since its last end was
# queued for a compaction alone.
_INPUTS = frozenset(
    {
        SessionEventType.USER_MESSAGE,
        SessionEventType.TOOL_APPROVAL_DECIDED,
        SessionEventType.CLIENT_TOOL_RESULT,
    }
)


def _started_by_claim(row: dict[str, Any], attempt: int) -> bool:
    """Whether `row` is this run's `session_start`, which a session's first claim logs."""
    return bool(
        row["type"] == SessionEventType.SESSION_START and row["data"].get("attempt") == attempt
    )


def undelivered_last(history: list[Message], delivered_seq: int) -> list[Message]:
    """Move user messages the model never saw (logged during the last turn, after it read the
    log) behind everything it did see: otherwise a follow-up that came in during the final
    turn sits before that turn's answer, the plan reads `already-complete`, and the message
    is never answered (and re-queues the session forever)."""
    late = [m for m in history if isinstance(m, UserMessage) and m.seq > delivered_seq]
    if not late:
        return history
    return [m for m in history if not any(m is x for x in late)] + late


def resume_reason(rows: list[dict[str, Any]]) -> Literal["crash", "shutdown", "follow_up"]:
    """`follow_up` when the previous run closed with `session_end` (a message re-queued the
    session); `shutdown` when its worker handed it over (`session_interrupted {shutdown}`);
    `crash` when it stopped without either."""
    for row in reversed(rows):
        if row["type"] == SessionEventType.SESSION_END:
            return "follow_up"
        if (
            row["type"] == SessionEventType.SESSION_INTERRUPTED
            and row["data"].get("reason") == "shutdown"
        ):
            return "shutdown"
        if row["type"] in _RUN_EVENTS:
            return "crash"
    return "crash"


def _call_data(call: ToolCall) -> dict[str, Any]:
    return {"toolCallId": call.id, "name": call.name, "arguments": call.arguments}


def argument_problem(call: ToolCall, tool: Tool) -> str | None:
    """Why the call's arguments cannot be given to its tool (None: they can)."""
    if call.invalid_arguments is not None:
        return "invalid arguments: not a JSON object (the call's arguments are shown as sent)"
    problems = tool.argument_errors(call.arguments)
    return "invalid arguments: " + "; ".join(problems) if problems else None


async def _run_by_client(arguments: dict[str, Any], context: ToolContext) -> str:
    raise ToolError("a client tool runs in its client, never in a worker")


def client_tools(declared: list[dict[str, Any]] | None) -> list[Tool]:
    """A session's `clientTools` (validated when they were given) as tools a worker offers
    the model and checks the calls of, but never runs."""
    return [
        Tool(
            str(tool["name"]),
            str(tool.get("description") or ""),
            tool.get("parameters") or {"type": "object", "properties": {}},
            _run_by_client,
            source="client",
        )
        for tool in declared or ()
    ]


def _question(arguments: dict[str, Any]) -> dict[str, Any]:
    data: dict[str, Any] = {"question": arguments.get("question", "")}
    if arguments.get("options"):
        data["options"] = arguments["options"]
    return data


class RunNotes:
    """The session's notes, as a run's tools see them. A note is written with the run's next
    write, the result of the tool that put it: the two commit together, or neither does (a
    crash in between re-runs the tool, and the note with it). A read sees the run's own
    notes not written yet."""

    def __init__(self, run: Run) -> None:
        self.run = run

    async def put(self, key: str, text: str) -> None:
        self.run.pending.put_note(key, text)

    async def get(self, key: str) -> str | None:
        pending = self.run.pending.notes.get(key)
        if pending is not None:
            return pending
        async with self.run.ctx.db.connection() as conn:
            return await get_note(conn, self.run.session_id, key)
