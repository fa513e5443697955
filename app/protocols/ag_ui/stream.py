"""An AG-UI run's stream: the Agent Protocol's run stream (`RunStream`: the session's log
through the process's feed, the turn's token chunks live and from the store, the run's
span) with `fold.AgUiFold` for its fold, and AG-UI's frames, `data:` lines alone. AG-UI
runs are POSTs that no client resumes, so the frames carry no ids."""

from __future__ import annotations

import json
from typing import Any

from app.protocols.ag_ui.fold import ENDS, AgUiFold
from app.protocols.agent_protocol import fold
from app.protocols.agent_protocol.stream import RunStream


def ag_ui_frame(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return b"data: " + data.encode() + b"\n\n"


class AgUiStream(RunStream):
    def __init__(
        self,
        row: dict[str, Any],
        run: fold.Run,
        thread_id: str,
        run_id: str,
        snapshot: bool = False,
    ) -> None:
        """`snapshot`: whether the run sends its client the thread's history."""
        super().__init__(row, run, None, frozenset())
        self.ag_ui = AgUiFold(
            row["id"],
            model=row["model"],
            run=run.id,
            thread_id=thread_id,
            run_id=run_id,
            snapshot_due=snapshot,
        )
        self.state = self.ag_ui

    def _out(self, name: str, data: Any, position: fold.Position) -> bytes | None:
        if name == "metadata":  # what opens the run's span
            name = "RUN_STARTED"
            data = {"threadId": self.ag_ui.thread_id, "runId": self.ag_ui.run_id}
        if name in ENDS:
            self.ended = True
        return ag_ui_frame({"type": name, **data})
