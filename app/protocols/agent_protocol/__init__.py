"""The Agent Protocol of the LangGraph SDKs (`langgraph-sdk`, `@langchain/langgraph-sdk`) over
Ferryman's sessions, mounted under `/agent-protocol` (SPEC section 9, docs/langgraph.md):
threads are sessions, runs spans of their log, checkpoints positions in it."""

from __future__ import annotations

from fastapi import APIRouter
from starlette._utils import get_route_path
from starlette.routing import Match
from starlette.types import Scope

from app.protocols.agent_protocol import assistants, crons, runs, threads, unserved
from app.protocols.agent_protocol.service import PREFIX


class PrefixRouter(APIRouter):
    """A router that answers no match at once for a path outside its prefix, rather than
    after trying each of its routes: the app tries it first (app/main.py), and neither the
    native API's requests nor the protocol's are tried against the other's routes."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = get_route_path(scope)
        if path != self.prefix and not path.startswith(self.prefix + "/"):
            return Match.NONE, {}
        return super().matches(scope)


router = PrefixRouter(prefix=PREFIX)
router.include_router(unserved.router)  # first: /threads/prune is not a thread id
router.include_router(crons.router)  # before runs: /runs/crons is not a run
# Runs before threads: a run's requests, the most frequent, are matched after fewer routes
# (no path of one router matches a path of the other).
router.include_router(runs.router)
router.include_router(threads.router)
router.include_router(assistants.router)
router.include_router(assistants.not_served)  # last: what no route above serves
