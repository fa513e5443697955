"""AG-UI (the Agent-User Interaction protocol of CopilotKit, `@ag-ui/client` and their peers)
over Ferryman's sessions, mounted under `/ag-ui` (SPEC section 10, docs/ag-ui.md): a POST of
a `RunAgentInput` starts a run on the session its `threadId` names and answers the run's
AG-UI events until the session settles."""

from __future__ import annotations

from app.protocols.ag_ui.routes import router

__all__ = ["router"]
