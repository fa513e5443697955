"""Which model a session's `model` names, on clients the worker shares between its runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.agent.models.base import Model, ModelFault
from app.agent.models.scripted import ScriptedModel
from app.tracing import traced_model

if TYPE_CHECKING:  # the SDKs load only when a session asks for their provider
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI


@dataclass(frozen=True)
class ProviderConfig:
    openai_base_url: str | None = None  # None: the SDK's default (api.openai.com)
    openai_api_key: str | None = None
    anthropic_base_url: str | None = None
    anthropic_api_key: str | None = None
    # Output budget for Anthropic, whose API requires one, when a session sets no maxTokens.
    anthropic_max_tokens: int = 8192
    idle_timeout: float = 60.0  # seconds without a chunk before a stream counts as stalled
    connect_timeout: float = 10.0


class Providers:
    """Builds each run's model. One SDK client per provider and worker: runs share its
    connection pool, and the SDK's own retries are off, since the runner retries visibly."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._openai: AsyncOpenAI | None = None
        self._anthropic: AsyncAnthropic | None = None

    def model(self, name: str, script: list[dict[str, Any]] | None) -> Model:
        return traced_model(name, self._model(name, script))  # each call a span when tracing

    def _model(self, name: str, script: list[dict[str, Any]] | None) -> Model:
        if name == "scripted":
            return ScriptedModel(script or [])
        provider, _, model_name = name.partition(":")
        if provider == "openai" and model_name:
            from app.agent.models.openai import OpenAIModel

            return OpenAIModel(self.openai_client(), model_name, self.config.idle_timeout)
        if provider == "anthropic" and model_name:
            from app.agent.models.anthropic import AnthropicModel

            return AnthropicModel(
                self.anthropic_client(),
                model_name,
                idle_timeout=self.config.idle_timeout,
                default_max_tokens=self.config.anthropic_max_tokens,
            )
        raise ModelFault(
            "not_found",
            f"unknown model {name!r}: use 'scripted', 'openai:<model>' or 'anthropic:<model>'",
        )

    def openai_client(self) -> AsyncOpenAI:
        if self._openai is None:
            from app.agent.models.openai import make_client

            self._openai = make_client(self.config)
        return self._openai

    def anthropic_client(self) -> AsyncAnthropic:
        if self._anthropic is None:
            from app.agent.models.anthropic import make_client

            self._anthropic = make_client(self.config)
        return self._anthropic

    async def aclose(self) -> None:
        for client in (self._openai, self._anthropic):
            if client is not None:
                await client.close()
        self._openai = self._anthropic = None
