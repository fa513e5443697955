"""Models: the interface, the scripted model and the OpenAI-compatible adapter."""

from __future__ import annotations

from typing import Any

from app.agent.models.base import Model, ModelError, ModelRequest
from app.agent.models.scripted import ScriptedModel


def make_model(
    name: str,
    script: list[dict[str, Any]] | None,
    *,
    openai_base_url: str,
    openai_api_key: str | None,
) -> Model:
    """The model a session asked for (`scripted` or `openai:<name>`)."""
    if name == "scripted":
        return ScriptedModel(script or [])
    if name.startswith("openai:"):
        from app.agent.models.openai import OpenAIModel

        return OpenAIModel(name.removeprefix("openai:"), openai_base_url, openai_api_key)
    raise ModelError(f"unknown model {name!r}: use 'scripted' or 'openai:<model-name>'")


__all__ = ["Model", "ModelError", "ModelRequest", "make_model"]
