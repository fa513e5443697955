"""AG-UI's endpoints: one per stored assistant, and one for a definition of the request's own
(`forwardedProps.ferryman`, or the server's defaults)."""

from __future__ import annotations

from fastapi.responses import StreamingResponse

from app.api.deps import Caller, CallerDep, ServicesDep
from app.api.limits import COUNTS_AG_UI_RUN
from app.api.streams import _direct_writes, _sse
from app.protocols.ag_ui import service
from app.protocols.ag_ui.schemas import RunAgentInput
from app.protocols.ag_ui.stream import AgUiStream
from app.protocols.agent_protocol import PrefixRouter
from app.protocols.agent_protocol.service import GRAPH_ID
from app.protocols.agent_protocol.stream import run_events
from app.services import Services

router = PrefixRouter(prefix=service.PREFIX, tags=["ag-ui"])


async def _run(
    services: Services, caller: Caller, assistant_id: str, body: RunAgentInput
) -> StreamingResponse:
    owner = caller.owner
    row, run, snapshot = await service.start(services, caller, assistant_id, body)
    stream = AgUiStream(row, run, body.threadId, body.runId, snapshot)
    direct = _direct_writes(services)
    return _sse(services, owner, run_events(services, row, stream, direct), direct)


@router.post("/agent", dependencies=[COUNTS_AG_UI_RUN])
async def run_agent(
    body: RunAgentInput, caller: CallerDep, services: ServicesDep
) -> StreamingResponse:
    """A run of the definition in `forwardedProps.ferryman` (the defaults without one)."""
    return await _run(services, caller, GRAPH_ID, body)


@router.post("/assistants/{assistant_id}", dependencies=[COUNTS_AG_UI_RUN])
async def run_assistant(
    assistant_id: str, body: RunAgentInput, caller: CallerDep, services: ServicesDep
) -> StreamingResponse:
    """A run of a stored assistant (its latest version pinned on the thread's first run)."""
    return await _run(services, caller, assistant_id, body)
