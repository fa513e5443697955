"""docs/reference.md, generated from the code: every setting, every limit, every error code.

`python -m app.reference` prints it and `--write` updates the committed file;
tests/test_reference.py fails when the two differ. Types, defaults and bounds come from the code;
the meanings are written here, and generating fails, naming each one, when a `Settings` field, a
named limit or a `ProblemCode` has none (or one is written for a name that is gone).
"""

from __future__ import annotations

import json
import re
import sys
import types
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import AliasChoices, SecretStr
from pydantic_core import PydanticUndefined

from app import config, cron, domain, generated, tokens
from app.agent.tools import builtin
from app.api import problems, schemas
from app.domain import SessionErrorCode
from app.errors import FerrymanError, ProblemCode
from app.protocols.ag_ui import schemas as ag_ui_schemas
from app.protocols.agent_protocol import assistants as protocol_assistants
from app.protocols.agent_protocol import runs as protocol_runs
from app.store import deltas
from app.streams import frames
from app.webhooks import sender as webhook_sender

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "reference.md"
OPENAPI = ROOT / "docs" / "openapi.json"

SETTINGS: dict[str, str] = {
    "database_url": "Any libpq URL or `key=value` string. Unset: the embedded PostgreSQL 18 in"
    " `FERRYMAN_DATA_DIR`.",
    "direct_database_url": "Where the connections that need a session of their own go (LISTEN,"
    " the workers' liveness locks and death watch, migrations). Unset: `DATABASE_URL`; set to"
    " another URL, `DATABASE_URL` is taken to be a transaction-mode pooler such as PgBouncer"
    " ([deploy.md](deploy.md)).",
    "data_dir": "The embedded database's directory. Default `/var/lib/ferryman` as root, else"
    " the user data directory (`~/.local/share/ferryman`).",
    "host": "Bind address (also `--host`). Loopback makes local mode the default.",
    "port": "Bind port (also `--port`; `0`: one the system chooses).",
    "auth": "`local`: requests without a key act as owner `local`; `keys`: every request needs"
    " an API key; `jwt`: every request needs a token of the identity provider (`FERRYMAN_JWT_*`,"
    " [clients.md](clients.md#tokens-of-an-identity-provider)). Unset: `local` on a loopback"
    " host, else `keys` (`local` is refused there).",
    "log_level": "`debug`, `info`, `warning` or `error`; `debug` (as `ferryman --debug`) also"
    " shows a start-up failure's traceback.",
    "log_format": "`json` lines, `console`, or `auto`: console on a terminal, else JSON.",
    "trace_content": "`true`: traces (`OTEL_*`, [tracing.md](tracing.md)) carry the prompts,"
    " completions, instructions and tool arguments and results; else only the models, settings,"
    " token counts and outcomes.",
    "pool_min_size": "Connections a process's pool keeps open.",
    "pool_max_size": "Most connections of a process's pool (a worker opens one more, for its"
    " token deltas: [deploy.md](deploy.md)).",
    "pool_timeout": "Seconds a request waits for a connection before it answers 503.",
    "worker_pool_timeout": "Seconds a worker's run waits for a connection before it stops (its"
    " session is resumed once its lease runs out).",
    "db_statement_timeout": "`statement_timeout` of every pooled connection, in seconds (0:"
    " none): a runaway statement answers 503 instead of holding the connection.",
    "db_lock_timeout": "`lock_timeout` of every pooled connection, in seconds (0: none).",
    "db_idle_in_transaction_timeout": "`idle_in_transaction_session_timeout` of every pooled"
    " connection, in seconds (0: none).",
    "embedded_check_interval": "Seconds between checks that the embedded PostgreSQL still runs;"
    " a server that stopped under a running process is started again.",
    "heartbeat_interval": "Seconds between a worker's lease renewals.",
    "lease_ttl": "Seconds after which a lease not renewed can be taken over.",
    "max_attempts": "How many runs in a row may end without finishing (each then taken over after"
    " a crash, a lost lease or a shutdown) before the claim that would take the session over once"
    " more fails it with `MAX_ATTEMPTS_EXCEEDED`. A run that finishes (`session_end`: succeeded,"
    " waiting, failed, cancelled) starts the count again, so follow-ups and approvals never use"
    " it up. The Session's `resumes` counts every takeover of its life; `attempt` counts runs.",
    "worker_concurrency": "Sessions one worker drives at once (also `ferryman worker"
    " --concurrency`).",
    "claim_batch": "Most sessions one claim statement takes when that many slots are free.",
    "claim_interval": "Seconds between polls for work when no NOTIFY arrives (the fallback).",
    "delta_flush_interval": "Seconds a worker holds token text to send it with more: one NOTIFY"
    " per worker and one `message_delta` frame per streaming session per interval.",
    "tool_timeout": "Seconds a tool call may run unless the tool sets its own budget.",
    "schedule_poll_interval": "Seconds between a worker's looks for due schedules (one indexed"
    " query); a tick fires up to this late, and once whatever the number of workers"
    " ([schedules.md](schedules.md)).",
    "schedule_catch_up": "After downtime (or a tick reached later than"
    " `FERRYMAN_SCHEDULE_GRACE`): `true`, one firing stands for all the missed ticks; `false`,"
    " none of them fires. Either way the schedule then goes on from its next future tick.",
    "schedule_grace": "Seconds late a tick may be reached and still fire on time; later (or"
    " with a later tick also due) it counts as missed.",
    "tool_modules": "Extra tools, comma-separated `module:attribute` (a `Tool` or a list).",
    "model": "The model of a session that names none: `scripted`, `openai:<model>` or"
    " `anthropic:<model>`.",
    "scripted_model": "In keys mode, whether keys may use the scripted model (a tenant"
    " scripts any tool call with any arguments); false: 403 `MODEL_NOT_ALLOWED`"
    " (docs/tenants.md).",
    "approval_separate": "True: the key that created a session may not approve or deny its"
    " calls (403 `APPROVAL_SEPARATE`); another key of the owner, or an approver key, must"
    " (docs/approvals.md).",
    "openai_base_url": "The server of `openai:<model>` models (any OpenAI-compatible one);"
    " unset: `https://api.openai.com/v1`.",
    "openai_api_key": "Sent to it as a bearer token; never logged.",
    "anthropic_base_url": "The server of `anthropic:<model>` models; unset:"
    " `https://api.anthropic.com`.",
    "anthropic_api_key": "Sent to it; never logged.",
    "anthropic_max_tokens": "Anthropic's required output budget when a session sets no"
    " `modelSettings.maxTokens`.",
    "model_idle_timeout": "Seconds a model stream may send nothing before the turn is retried.",
    "model_connect_timeout": "Seconds to connect to a model server.",
    "model_max_retries": "Retries of one model turn before the session fails with"
    " `MODEL_UNAVAILABLE`.",
    "model_retry_initial_delay": "Seconds of the first retry's backoff.",
    "model_retry_max_delay": "Longest backoff, and the longest `Retry-After` honoured, in seconds.",
    "openai_max_concurrent": "Calls of `openai:` models in flight at once, across every worker"
    " ([budgets.md](budgets.md)); unset: no limit.",
    "openai_rpm": "Requests per minute to `openai:` models, across every worker; unset: no limit.",
    "openai_tpm": "Tokens (input and output, as reported) per minute of `openai:` models, across"
    " every worker; unset: no limit.",
    "anthropic_max_concurrent": "Calls of `anthropic:` models in flight at once, across every"
    " worker; unset: no limit.",
    "anthropic_rpm": "Requests per minute to `anthropic:` models, across every worker; unset: no"
    " limit.",
    "anthropic_tpm": "Tokens per minute of `anthropic:` models, across every worker; unset: no"
    " limit.",
    "provider_budgets": 'Budgets as JSON keyed `"provider"` or `"provider:model"`, each'
    ' `{"maxConcurrent", "rpm", "tpm"}`; a model\'s own stands instead of its provider\'s, and'
    " `{}` shares only the provider's 429 pauses ([budgets.md](budgets.md)).",
    "mcp_servers": "A `.toml` or `.json` file listing MCP servers ([mcp.md](mcp.md)).",
    "mcp_connect_timeout": "Seconds a starting worker waits for its MCP servers before it"
    " claims work.",
    "ping_interval": "Seconds between SSE keep-alive comments.",
    "poll_interval": "Seconds between reads of the heads of all of a process's streams, for a"
    " lost NOTIFY (one query).",
    "replay_limit": "Owner events a reconnect may replay before `resync_required`.",
    "sse_retry_ms": "The `retry:` sent to EventSource clients, in milliseconds.",
    "max_streams_per_owner": "Open SSE streams (both kinds) of one owner on one API process;"
    " above: 429 `TOO_MANY_STREAMS`.",
    "stream_write_bytes": "Most bytes of one SSE write (or one event, if bigger); a stream"
    " whose client does not read holds about two writes.",
    "feed_buffer_bytes": "Bytes of recent events a feed keeps in memory for its streams (the"
    " newest always).",
    "stream_shortcuts": "A feed writes new events straight to uvicorn's transport for the"
    " streams parked at its tail, and glibc's `malloc_trim` gives the heap's free pages back"
    " after feeds close. `false`: every frame goes through ASGI `send`, nothing calls"
    " `malloc_trim`; the streams deliver the same frames either way.",
    "stream_outage_close": "Seconds an API process's reads of the logs may keep failing (none"
    " succeeding) before it closes its SSE streams, so their clients reconnect with"
    " `Last-Event-ID`, through a load balancer to a host that can read, and miss nothing. A"
    " shorter outage (a lost NOTIFY, one failed read, a database restart) closes none.",
    "max_body_bytes": "Request body limit; above: 413 `PAYLOAD_TOO_LARGE`.",
    "cancel_wait_seconds": "The longest `cancel?wait=true`, or a `DELETE` of a running"
    " session, holds the answer.",
    "transcript_page_bytes": "A transcript page, and each read of the log by a run, stops at"
    " this many bytes of events (at least one event).",
    "list_max_bytes": "A session list page (and an Agent Protocol threads search) stops before"
    " the item that would take its answer past this many bytes, with its `nextPageToken` (at"
    " least one item).",
    "list_excerpt_chars": "A listed session's `prompt` and `instructions` are cut to this many"
    " characters (`truncated` names which were); GET the session for them whole.",
    "max_event_bytes": "Model text and tool output beyond this are cut, with a marker, before"
    " they are logged (a user message never is).",
    "model_tool_result_max_chars": "A tool result longer than this is shown to the model cut,"
    " with a marker; the log keeps it whole (docs/compaction.md).",
    "max_agent_depth": "A delegate's child this many delegations below the session a person"
    " made is offered no delegate tools: chains of agents stop there (docs/delegation.md).",
    "owner_max_running": "Sessions an owner may have running: workers claim no more of its"
    " queued ones until one ends, and claim other owners' meanwhile (docs/tenants.md). Unset:"
    " no limit.",
    "owner_max_queued": "Sessions an owner may have queued: a create or message (or protocol"
    " run) that would queue one more is 429 `OWNER_QUEUE_FULL`. Unset: no limit.",
    "key_creates_per_minute": "Creates a key may make a minute (native creates, Agent Protocol"
    " threads and stateless runs): 429 `RATE_LIMITED` beyond; a key's policy"
    " `createsPerMinute` overrides it. Unset: no limit.",
    "key_messages_per_minute": "Messages a key may send a minute (native messages, Agent"
    " Protocol runs on a thread, AG-UI runs): 429 `RATE_LIMITED` beyond; a key's policy"
    " `messagesPerMinute` overrides it. Unset: no limit.",
    "admin_token": "The bearer token of the keys API (`/api/keys`, docs/tenants.md); unset,"
    " that API answers 404.",
    "local_hosts": "More `Host` names local mode answers (names of this machine), comma-separated.",
    "cors_origins": "Origins (`https://app.example.com`) whose browser pages may call the API"
    " (CORS), comma-separated; `*` for any. Keys travel in headers, never cookies.",
    "metrics_token": "In keys (or jwt) mode `/metrics` takes only this bearer token; unset, it"
    " answers 403 `METRICS_TOKEN_REQUIRED` (its counts are every owner's).",
    "jwt_jwks_url": "jwt mode (required): the identity provider's JWK set, `https://...`; its"
    " keys are cached.",
    "jwt_issuer": "jwt mode (required): the `iss` every token must carry.",
    "jwt_audience": "jwt mode (required): the audience every token's `aud` must name.",
    "jwt_owner_claim": "The claim naming a token's owner: a string of the owner id's form (1 to"
    " 128 letters, digits and `. _ @ -`), else 401 `TOKEN_INVALID`.",
    "jwt_algorithms": "The signature algorithms tokens may use, comma-separated: asymmetric ones"
    " only (`none` and `HS*` are refused at start-up).",
    "jwt_leeway": "Seconds of clock difference with the identity provider allowed on `exp`, `nbf`"
    " and `iat`.",
    "jwt_jwks_refetch_interval": "Seconds between fetches of the key set: a token naming a `kid`"
    " the cached set lacks fetches it again at most this often (and a failed fetch is retried"
    " no sooner).",
    "jwt_jwks_max_age": "Seconds after which the cached key set is fetched again, so a withdrawn"
    " key stops being accepted; while the provider cannot be reached the old keys stay in use.",
    "jwt_jwks_timeout": "Seconds one fetch of the key set may take in all.",
    "webhook_allow_hosts": "Hosts (names or addresses, comma-separated) a webhook may point at"
    " though they are private, link-local or loopback ([webhooks.md](webhooks.md)).",
    "webhook_send": "Whether this process (API or worker) sends webhook deliveries.",
    "webhook_max_age": "Seconds a webhook delivery is retried from its event; then it is"
    " abandoned.",
    "webhook_retry_initial_delay": "Seconds before a failed delivery's second attempt; each"
    " later wait doubles.",
    "webhook_retry_max_delay": "The longest wait between a delivery's attempts, in seconds.",
    "webhook_connect_timeout": "Seconds a delivery's attempt may take to connect.",
    "webhook_read_timeout": "Seconds a delivery's attempt may wait for the receiver (each read;"
    " the whole attempt is bounded by this and the connect timeout together).",
    "webhook_poll_interval": "Seconds between a process's looks for due webhook deliveries.",
    "webhook_batch": "Webhook deliveries a process claims and sends at once.",
    "webhook_delivery_retention_days": "Sent and abandoned webhook deliveries are pruned after"
    " this.",
    "owner_event_retention_days": "Owner events older than this are pruned (the newest is kept).",
    "deleted_session_retention_days": "Soft-deleted sessions are purged after this.",
    "idempotency_key_retention_hours": "How long an `Idempotency-Key` is remembered.",
    "retention_interval": "Seconds between the API process's pruning runs.",
}

# Modules whose MAX_* and *LIMIT* constants bound what a client or a model may send.
LIMIT_MODULES = (
    domain,
    schemas,
    config,
    builtin,
    frames,
    deltas,
    protocol_assistants,
    protocol_runs,
    ag_ui_schemas,
    tokens,
    cron,
    webhook_sender,
)
NAMED_LIMITS: dict[str, str] = {
    "MAX_AG_UI_MESSAGES": "AG-UI: `messages` of a `RunAgentInput` (the history it resends).",
    "MAX_AG_UI_RESUME_ENTRIES": "AG-UI: `resume` entries of a `RunAgentInput`.",
    "MAX_AG_UI_ID_CHARS": "AG-UI: a `threadId`, `runId` or `interruptId`, in characters.",
    "MAX_PROMPT_CHARS": "A session's `prompt`, in characters.",
    "MAX_MESSAGE_CHARS": "A message's `text`, an approval's `reason`, a scripted turn's"
    " `text`, in characters.",
    "MAX_TITLE_CHARS": "A session's `title`, in characters.",
    "MAX_PRIORITY": "A session's `priority` (and a key's policy's), from -100 to this.",
    "MAX_SCOPE_ENTRIES": "Entries in each of a key policy's `tools`, `models` and `approverFor`.",
    "MAX_FORK_EVENTS": "Events a fork copies: its `atSeq` (docs/fork.md).",
    "MAX_DELEGATES": "Assistants in one session's or assistant's `delegates` (docs/delegation.md).",
    "MAX_METADATA_BYTES": "A session's `metadata` (and a scripted call's `arguments`), as"
    " compact JSON, in bytes.",
    "MAX_JSON_DEPTH": "Nesting of `metadata` and tool arguments, in levels.",
    "MAX_SCRIPT_TURNS": "Turns of a `script`.",
    "MAX_TOOLS": "Names in `tools`, and in `approvalRequired`.",
    "MAX_CLIENT_TOOLS": "Tools of a session's `clientTools` (AG-UI: a `RunAgentInput`'s `tools`).",
    "MAX_CLIENT_TOOLS_BYTES": "A session's `clientTools` together, as compact JSON, in bytes.",
    "MAX_INSTRUCTIONS_CHARS": "A session's `instructions`, in characters.",
    "MAX_STOP_SEQUENCES": "Strings in `modelSettings.stop`.",
    "MAX_KEEP_RECENT_TURNS": "The most `compaction.keepRecentTurns`.",
    "MAX_ASSISTANT_SEARCH_LIMIT": "Agent Protocol: `limit` of an assistants search and of an"
    " assistant's versions.",
    "MAX_ASSISTANT_SEARCH_OFFSET": "Agent Protocol: `offset` of an assistants search and of an"
    " assistant's versions.",
    "MAX_PENDING_DELETES": "Agent Protocol: stateless runs' threads one API process holds to"
    " delete once their run ends; past it (or after a restart) the retention pass deletes them"
    " ([langgraph.md](langgraph.md)).",
    "MAX_JWKS_BYTES": "jwt mode: the identity provider's key set, in bytes (bigger: not"
    " used, `TOKEN_KEYS_UNAVAILABLE` if no set was fetched before).",
    "MAX_IDEMPOTENCY_KEY_CHARS": "The `Idempotency-Key` header, in characters.",
    "MAX_ASSISTANT_NAME_CHARS": "An assistant's `name`, in characters.",
    "MAX_ASSISTANT_DESCRIPTION_CHARS": "An assistant's `description`, in characters.",
    "MAX_ASSISTANTS_PER_OWNER": "An owner's assistants, deleted ones not counted (more: 409"
    " `ASSISTANT_LIMIT_REACHED`).",
    "MAX_ASSISTANT_VERSIONS": "Versions of one assistant (a `PATCH` past it: 409"
    " `ASSISTANT_LIMIT_REACHED`).",
    "MAX_SCHEDULES_PER_OWNER": "An owner's schedules (more: 409 `SCHEDULE_LIMIT_REACHED`).",
    "MAX_SCHEDULE_FIRINGS": "Firings a schedule keeps and shows (`lastFirings`), newest first.",
    "MAX_CRON_CHARS": "A schedule's `cron`, in characters (more: 422 `SCHEDULE_CRON_INVALID`).",
    "MAX_TIMEZONE_CHARS": "A schedule's `timezone`, in characters (more: 422"
    " `SCHEDULE_TIMEZONE_INVALID`).",
    "MAX_WEBHOOKS_PER_OWNER": "An owner's webhooks (more: 409 `WEBHOOK_LIMIT_REACHED`).",
    "MAX_WEBHOOK_URL_CHARS": "A webhook's `url`, in characters.",
    "MAX_ERROR_CHARS": "Of a webhook receiver's failed answer, what a delivery keeps as its"
    " `lastError`, in characters.",
    "MAX_SLEEP_SECONDS": "The `sleep` tool's `seconds` (more: an error tool result).",
    "MAX_NOTE_KEY_CHARS": "A note's key, in characters (more: an error tool result).",
    "MAX_NOTE_CHARS": "A note's text, in characters (more: an error tool result).",
    "MAX_QUESTION_CHARS": "An `ask_user` question, in characters (more: an error tool result).",
    "MAX_CURSOR": "`Last-Event-ID`, `lastEventId` and `after`: a decimal integer up to this"
    " (else 400 `INVALID_CURSOR`, or 422 for `after`).",
    "MAX_CURSOR_CHUNK": "The chunk of a session stream's cursor `<seq>.<chunk>` (a token"
    " delta's id), up to this (else 400 `INVALID_CURSOR`).",
    "MAX_STORED_CHUNKS_PER_TURN": "Token chunks (a worker's flushes) of one turn kept for"
    " reconnects; the turn's later chunks are sent live only (its message has the whole text).",
    "MAX_CHUNK_AGE_SECONDS": "Stored token chunks older than this are deleted (swept every 30 s"
    " by a worker's flush), whether or not their turn ended: until then a join from a chunk's"
    " id gets the rest of its turn.",
}

# The status each code answers with (None: whichever HTTP error status it stands for).
PROBLEM_CODES: dict[ProblemCode, tuple[int | None, str]] = {
    ProblemCode.BAD_REQUEST: (400, "A request the server cannot take, of no other kind."),
    ProblemCode.MALFORMED_JSON: (400, "The body is not valid JSON: nothing could be validated."),
    ProblemCode.INVALID_CURSOR: (
        400,
        "`Last-Event-ID` or `lastEventId` is not a decimal integer below 2^63 (on a session"
        " stream: or `<seq>.<chunk>`, a token delta's id).",
    ),
    ProblemCode.INVALID_PAGE_TOKEN: (400, "A `pageToken` this server did not give out."),
    ProblemCode.AUTH_REQUIRED: (401, "Keys or jwt mode, and the request has no key or token."),
    ProblemCode.INVALID_API_KEY: (401, "The API key is unknown or revoked."),
    ProblemCode.METRICS_TOKEN_REQUIRED: (
        403,
        "Keys or jwt mode, and no `FERRYMAN_METRICS_TOKEN` is set: `/metrics` serves no tenant's"
        " key, set the token and scrape with it.",
    ),
    ProblemCode.TOKEN_INVALID: (
        401,
        "jwt mode: the token is not a JWT, or its signature, algorithm, key (`kid`), issuer,"
        " audience, `nbf`, `exp` claim or owner claim is wrong or missing; `detail` says which.",
    ),
    ProblemCode.TOKEN_EXPIRED: (401, "jwt mode: the token's `exp` has passed; get a new one."),
    ProblemCode.TOKEN_KEYS_UNAVAILABLE: (
        401,
        "jwt mode: the identity provider's key set has never been fetched (unreachable, or not"
        " a JWK set), so no token can be checked; retry later.",
    ),
    ProblemCode.CROSS_SITE_REQUEST: (
        403,
        "Local mode: a write whose `Origin` is not a local page (or is `null`).",
    ),
    ProblemCode.LOCAL_MODE_NOT_LOCAL: (
        403,
        "Local mode: a request from another address, or through a proxy that says so.",
    ),
    ProblemCode.NOT_FOUND: (404, "No such path (or resource other than a session)."),
    ProblemCode.SESSION_NOT_FOUND: (
        404,
        "No such session for this owner (also a malformed id,"
        " a deleted session and another owner's).",
    ),
    ProblemCode.ASSISTANT_NOT_FOUND: (
        404,
        "No such assistant for this owner, or no such version of it (also a malformed id, a"
        " deleted assistant and another owner's); for an `assistantId` of a session too.",
    ),
    ProblemCode.ASSISTANT_LIMIT_REACHED: (
        409,
        "A create past `MAX_ASSISTANTS_PER_OWNER`, or an edit past `MAX_ASSISTANT_VERSIONS`.",
    ),
    ProblemCode.SCHEDULE_NOT_FOUND: (
        404,
        "No such schedule for this owner (also a malformed id, a deleted schedule and another"
        " owner's).",
    ),
    ProblemCode.SCHEDULE_LIMIT_REACHED: (409, "A create past `MAX_SCHEDULES_PER_OWNER`."),
    ProblemCode.SCHEDULE_CRON_INVALID: (
        422,
        "A schedule's `cron` is not five fields (or six with seconds first, or an `@` alias)"
        " croniter reads, or never fires; `errors[0].message` says why.",
    ),
    ProblemCode.SCHEDULE_TIMEZONE_INVALID: (
        422,
        "A schedule's `timezone` is not a key of the IANA time zone database (`Europe/Berlin`,"
        " `UTC`).",
    ),
    ProblemCode.WEBHOOK_NOT_FOUND: (
        404,
        "No such webhook for this owner (also a malformed id and another owner's).",
    ),
    ProblemCode.WEBHOOK_LIMIT_REACHED: (409, "A create past `MAX_WEBHOOKS_PER_OWNER`."),
    ProblemCode.WEBHOOK_TARGET_REFUSED: (
        422,
        "A webhook `url` that is not http(s), carries credentials, or names a private,"
        " link-local or loopback host not in `FERRYMAN_WEBHOOK_ALLOW_HOSTS`.",
    ),
    ProblemCode.METHOD_NOT_ALLOWED: (
        405,
        "The path does not take this method (`Allow` names those it does).",
    ),
    ProblemCode.NOT_ACCEPTABLE: (
        406,
        "The `Accept` header excludes every type the path can answer with.",
    ),
    ProblemCode.SESSION_ALREADY_TERMINAL: (409, "Cancel of a session that has already ended."),
    ProblemCode.IDEMPOTENCY_KEY_REUSED: (
        409,
        "An `Idempotency-Key` used before with another body.",
    ),
    ProblemCode.APPROVAL_NOT_PENDING: (
        409,
        "A decision for a call that is not waiting for one"
        " (unknown, decided, answered, or a finished session).",
    ),
    ProblemCode.CLIENT_TOOL_NOT_PENDING: (
        409,
        "A result for a call that is not waiting for the client's result (unknown, not a"
        " client tool's, answered with another result, or a finished session).",
    ),
    ProblemCode.SESSION_NOT_COMPACTABLE: (
        409,
        "`POST /compact` of a session that is idle (nothing to compact), failed or cancelled.",
    ),
    ProblemCode.FORK_SEQ_OUT_OF_RANGE: (
        422,
        "A fork's `atSeq` past the parent's last committed event (`lastSeq` says which that is).",
    ),
    ProblemCode.FORK_TOO_LONG: (
        422,
        "A fork's `atSeq` over `MAX_FORK_EVENTS`: the history it would copy is too long.",
    ),
    ProblemCode.TOOL_NOT_ALLOWED: (
        403,
        "A session, assistant, fork, schedule or run asks for tools the caller's key may not"
        " use (its policy's `tools`; `tools` lists them, empty when the definition left"
        " `tools` unset, which is every tool).",
    ),
    ProblemCode.MODEL_NOT_ALLOWED: (
        403,
        "A definition asks for a model the caller's key may not use (its policy's `models`;"
        " the scripted model in keys mode without FERRYMAN_SCRIPTED_MODEL); `model` names it.",
    ),
    ProblemCode.APPROVAL_SEPARATE: (
        403,
        "FERRYMAN_APPROVAL_SEPARATE: the key that created the session may not decide its"
        " approvals.",
    ),
    ProblemCode.DELEGATE_CYCLE: (
        422,
        "A session's or assistant's `delegates` would let a chain of assistants come back to"
        " one already on it (`cycle` lists it).",
    ),
    ProblemCode.FORK_NOT_USER_MESSAGE: (
        422,
        "A fork with a `message` at a seq that is not a `user_message` (`eventType` says what).",
    ),
    ProblemCode.PAYLOAD_TOO_LARGE: (413, "The body is over `FERRYMAN_MAX_BODY_BYTES`."),
    ProblemCode.UNSUPPORTED_MEDIA_TYPE: (415, "A body not sent as `application/json`."),
    ProblemCode.HOST_NOT_ALLOWED: (
        421,
        "Local mode: a `Host` that is not this machine's (a"
        " page of another site whose name was rebound).",
    ),
    ProblemCode.VALIDATION_ERROR: (
        422,
        "A field breaks a rule: `errors` lists each as"
        " `{field, message, type}`, `detail` names the first three.",
    ),
    ProblemCode.TOO_MANY_STREAMS: (
        429,
        "The owner holds `FERRYMAN_MAX_STREAMS_PER_OWNER` open"
        " streams on this process; with `Retry-After`.",
    ),
    ProblemCode.KEY_NOT_FOUND: (
        404,
        "The keys API: the id names no key, or a revoked one (docs/tenants.md).",
    ),
    ProblemCode.OWNER_QUEUE_FULL: (
        429,
        "The owner has `FERRYMAN_OWNER_MAX_QUEUED` sessions queued (docs/tenants.md); with"
        " `Retry-After`.",
    ),
    ProblemCode.RATE_LIMITED: (
        429,
        "The key made its creates or messages of this minute (docs/tenants.md); with"
        " `Retry-After`, the seconds to the next minute.",
    ),
    ProblemCode.HTTP_ERROR: (None, "Any other HTTP error status (the status says which)."),
    ProblemCode.INTERNAL_ERROR: (500, "A bug: the server logs the traceback."),
    ProblemCode.DATABASE_UNAVAILABLE: (
        503,
        "PostgreSQL cannot be reached, or gave no connection or lock in time; with `Retry-After`.",
    ),
    ProblemCode.NOT_READY: (503, "`/readyz`: `checks.database` says `busy` or `unavailable`."),
    ProblemCode.THREAD_EXISTS: (
        409,
        "Agent Protocol: a thread create with `if_exists: raise` (the default) names a"
        " thread id that is taken.",
    ),
    ProblemCode.THREAD_BUSY: (
        409,
        "Agent Protocol: a run on a busy thread with `multitask_strategy: reject` (the default).",
    ),
    ProblemCode.RUN_NOT_FOUND: (404, "Agent Protocol: no such run on the caller's thread."),
    ProblemCode.NO_PENDING_INTERRUPT: (
        409,
        "Agent Protocol: `command.resume` on a thread with no pending interrupt, or a resume"
        " map naming an interrupt that is not pending.",
    ),
    ProblemCode.INPUT_NOT_SUPPORTED: (
        422,
        "Agent Protocol: run input Ferryman cannot map (a message that is not human text,"
        " `command.goto` or `command.update`, no input and no resume).",
    ),
    ProblemCode.NOT_SERVED: (
        501,
        "Agent Protocol: a part of the protocol Ferryman does not serve (docs/langgraph.md"
        " lists them).",
    ),
    ProblemCode.ASSISTANT_EXISTS: (
        409,
        "Agent Protocol: `POST /assistants` with an `assistant_id` that is taken (with"
        " `if_exists: do_nothing`, the caller's own assistant answers 200 instead).",
    ),
}


SESSION_ERROR_CODES: dict[SessionErrorCode, str] = {
    SessionErrorCode.MAX_ATTEMPTS_EXCEEDED: "`FERRYMAN_MAX_ATTEMPTS` runs in a row ended without"
    " finishing (each taken over after a crash, a lost lease or a shutdown); the model is not"
    " called again.",
    SessionErrorCode.MODEL_BAD_REQUEST: "The provider answered 400 or 422.",
    SessionErrorCode.MODEL_AUTH_FAILED: "401 or 403: a missing or wrong key.",
    SessionErrorCode.MODEL_NOT_FOUND: "404, or a model name no provider serves.",
    SessionErrorCode.MODEL_CONTEXT_TOO_LONG: "The conversation no longer fits the model's"
    " context, even after one compaction and a retry (docs/compaction.md).",
    SessionErrorCode.MODEL_REFUSED: "A content filter or the model itself refused the turn.",
    SessionErrorCode.MODEL_ERROR: "A model plug-in failed in a way it did not classify.",
    SessionErrorCode.MODEL_UNAVAILABLE: "Retryable faults (429, 5xx, dropped or stalled streams)"
    " outlasted `FERRYMAN_MODEL_MAX_RETRIES`.",
}


class MissingReference(Exception):
    """The code has names the reference does not explain, or the reference names gone ones."""


def _check_names(kind: str, in_code: set[str], written: set[str]) -> list[str]:
    missing = [f"{kind} {name} has no meaning in app/reference.py" for name in in_code - written]
    stale = [
        f"{kind} {name} is in app/reference.py but not in the code" for name in written - in_code
    ]
    return sorted(missing) + sorted(stale)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " or ".join(f"`{arg}`" for arg in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(annotation) if a is not type(None))
    names = {str: "text", int: "integer", float: "number", bool: "boolean", Path: "path"}
    if annotation is SecretStr:
        return "secret text"
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


_BOUNDS = {
    annotated_types.Gt: ("gt", "> {}"),
    annotated_types.Ge: ("ge", "≥ {}"),
    annotated_types.Lt: ("lt", "< {}"),
    annotated_types.Le: ("le", "≤ {}"),
}


def _bounds(metadata: list[Any]) -> str:
    found = []
    for item in metadata:
        for kind, (attribute, form) in _BOUNDS.items():
            if isinstance(item, kind):
                found.append(form.format(_number(getattr(item, attribute))))
    return ", ".join(found)


def _number(value: Any, separated: bool = True) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and separated:
        return f"{value:,}"
    return str(value)


def _default(field: Any) -> str:
    if field.default_factory is not None or field.default is PydanticUndefined:
        return "(see meaning)"
    if field.default is None:
        return "unset"
    if field.default == "":
        return "empty"
    if isinstance(field.default, Enum):
        return f"`{field.default.value}`"
    return f"`{_number(field.default, separated=False)}`"


def _variable(name: str, field: Any) -> str:
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return " or ".join(f"`{choice}`" for choice in alias.choices)
    prefix = config.Settings.model_config.get("env_prefix", "")
    return f"`{prefix}{name}`".upper().replace("`FERRYMAN_", "`FERRYMAN_")


def configuration() -> str:
    rows = []
    for name, field in config.Settings.model_fields.items():
        kind = _type_name(field.annotation)
        bounds = _bounds(field.metadata)
        rows.append(
            (
                _variable(name, field),
                f"{kind}, {bounds}" if bounds else kind,
                _default(field),
                SETTINGS.get(name, ""),
            )
        )
    return _table(("variable", "type", "default", "meaning"), rows)


def named_limits() -> tuple[str, dict[str, Any]]:
    found: dict[str, tuple[Any, str]] = {}
    for module in LIMIT_MODULES:
        for name, value in vars(module).items():
            named = re.fullmatch(r"[A-Z][A-Z0-9_]*", name) and ("MAX" in name or "LIMIT" in name)
            if named and isinstance(value, int) and name not in found:
                found[name] = (value, module.__name__)
    rows = [
        (f"`{name}`", _number(value), f"`{module}`", NAMED_LIMITS.get(name, ""))
        for name, (value, module) in found.items()
    ]
    return _table(("name", "value", "defined in", "meaning"), rows), found


def _resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _schema_bounds(schema: dict[str, Any]) -> str:
    parts = []
    if "maxLength" in schema:
        low, high = schema.get("minLength", 0), _number(schema["maxLength"])
        parts.append(f"{low}..{high} characters" if low else f"at most {high} characters")
    if "maxItems" in schema:
        parts.append(f"at most {_number(schema['maxItems'])} items")
    if "minimum" in schema and "maximum" in schema:
        parts.append(f"{_number(schema['minimum'])}..{_number(schema['maximum'])}")
    else:
        for key, form in _SCHEMA_BOUNDS.items():
            if key in schema:
                parts.append(form.format(_number(schema[key])))
    return ", ".join(parts)


_SCHEMA_BOUNDS = {
    "exclusiveMinimum": "> {}",
    "minimum": "≥ {}",
    "exclusiveMaximum": "< {}",
    "maximum": "≤ {}",
}


def _walk(
    schema: dict[str, Any], path: str, document: dict[str, Any], seen: frozenset[str]
) -> list[tuple[str, str]]:
    ref = schema.get("$ref")
    if ref in seen:
        return []
    seen = seen | {ref} if ref else seen
    schema = _resolve(schema, document)
    rows = []
    bounds = _schema_bounds(schema)
    if bounds and path:
        rows.append((path, bounds))
    for member in schema.get("anyOf", []) + schema.get("oneOf", []):
        rows += _walk(member, path, document, seen)
    for name, member in schema.get("properties", {}).items():
        rows += _walk(member, f"{path}.{name}" if path else name, document, seen)
    if "items" in schema:
        rows += _walk(schema["items"], f"{path}[]", document, seen)
    return rows


def request_limits() -> str:
    document = json.loads(OPENAPI.read_text())
    rows = []
    for route, operations in document["paths"].items():
        for method, operation in operations.items():
            where = f"`{method.upper()} {route}`"
            for parameter in operation.get("parameters", []):
                bounds = _schema_bounds(_resolve(parameter["schema"], document))
                if bounds:
                    rows.append((where, f"{parameter['in']} `{parameter['name']}`", bounds))
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                for path, bounds in _walk(body["schema"], "", document, frozenset()):
                    rows.append((where, f"body `{path}`", bounds))
    return _table(("operation", "field", "bounds"), list(dict.fromkeys(rows)))


def _error_classes(cls: type[FerrymanError]) -> list[type[FerrymanError]]:
    return [cls] + [sub for child in cls.__subclasses__() for sub in _error_classes(child)]


def error_codes() -> tuple[str, list[str]]:
    problems_found = []
    for cls in _error_classes(FerrymanError):
        written = PROBLEM_CODES.get(cls.code)
        if written and written[0] != cls.status:
            problems_found.append(
                f"{cls.__name__} answers {cls.status} {cls.code}, the reference says {written[0]}"
            )
    for status, code in problems._HTTP_CODES.items():
        written = PROBLEM_CODES.get(code)
        if written and written[0] != status:
            problems_found.append(f"HTTP {status} answers {code}, the reference says {written[0]}")
    rows = [
        (f"`{code}`", str(PROBLEM_CODES[code][0] or "other"), PROBLEM_CODES[code][1])
        for code in ProblemCode
        if code in PROBLEM_CODES
    ]
    return _table(("code", "status", "meaning"), rows), problems_found


def session_error_codes() -> str:
    rows = [
        (f"`{c}`", SESSION_ERROR_CODES[c]) for c in SessionErrorCode if c in SESSION_ERROR_CODES
    ]
    return _table(("code", "meaning"), rows)


def render() -> str:
    """The reference page; MissingReference if a name of the code has no meaning here."""
    limits_table, limits = named_limits()
    codes_table, inconsistent = error_codes()
    faults = (
        _check_names("setting", set(config.Settings.model_fields), set(SETTINGS))
        + _check_names("limit", set(limits), set(NAMED_LIMITS))
        + _check_names(
            "problem code", {str(c) for c in ProblemCode}, {str(c) for c in PROBLEM_CODES}
        )
        + _check_names(
            "session error code",
            {str(c) for c in SessionErrorCode},
            {str(c) for c in SESSION_ERROR_CODES},
        )
        + inconsistent
    )
    if faults:
        raise MissingReference("; ".join(faults))
    return f"""# Reference: configuration, limits, error codes

Generated from the code by `python -m app.reference --write` (tests/test_reference.py fails when
this file and the code differ). Types, defaults and bounds are the code's; the meanings are
written in `app/reference.py`.

## Configuration

Environment variables, all optional (`ferryman serve --help` shows the flags that set some of
them). Durations are in seconds unless the name says otherwise.

{configuration()}

## Limits

Every limit is enforced where it is named, and answers a 4xx problem+json when exceeded (the
tools' limits answer the model with an error tool result). Strings must be storable by
PostgreSQL: NUL characters and unpaired surrogates are refused with 422, never a 500. Limits
that are settings are in the table above (`FERRYMAN_MAX_BODY_BYTES`,
`FERRYMAN_TRANSCRIPT_PAGE_BYTES`, `FERRYMAN_MAX_EVENT_BYTES`, `FERRYMAN_MAX_STREAMS_PER_OWNER`,
`FERRYMAN_STREAM_WRITE_BYTES`, the `FERRYMAN_DB_*_TIMEOUT`s).

### Named limits

{limits_table}

### Every bound of a request

From [openapi.json](openapi.json); a request outside one answers 422 `VALIDATION_ERROR`, naming
the field.

{request_limits()}

## Error codes

Every error answers `application/problem+json` (RFC 9457) with one of these stable `code`s (the
`Problem.code` enum of [openapi.json](openapi.json)).

{codes_table}

### A failed session's `error.code`

On the Session's `error`, `session_status` and `session_end` ([models.md](models.md) tells
how the model faults are retried first).

{session_error_codes()}
"""


def _render_or_exit() -> str:
    try:
        return render()
    except MissingReference as missing:
        sys.exit(f"error: {missing}")


def main(argv: list[str] | None = None) -> None:
    generated.main(COMMITTED, __doc__.splitlines()[0], _render_or_exit, argv)


if __name__ == "__main__":
    main()
