"""Models: the interface, fault handling, the scripted model and the provider adapters."""

from app.agent.models.base import (
    Model,
    ModelFault,
    ModelRequest,
    ModelSettings,
    ToolSpec,
)
from app.agent.models.providers import ProviderConfig, Providers
from app.agent.models.retry import RetryPolicy

__all__ = [
    "Model",
    "ModelFault",
    "ModelRequest",
    "ModelSettings",
    "ProviderConfig",
    "Providers",
    "RetryPolicy",
    "ToolSpec",
]
