"""The workbench's fold (app/web/conversation.js over the package's SessionFold, which it
imports from app/web/ferryman-client.js) under node: token deltas numbered `chunk` are applied
once, so a reconnect from an event mid-turn (which replays the turn's stored chunks) repeats no
text, and the page resumes from `<seq>.<chunk>`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.support import REPO, missing


def test_a_replayed_chunk_is_applied_once() -> None:
    node = shutil.which("node")
    if node is None:
        missing("node is not installed", "the workbench fold under node")
    script = Path(REPO) / "tests" / "workbench_chunks.mjs"
    fold = (Path(REPO) / "app" / "web" / "conversation.js").as_uri()
    done = subprocess.run([node, str(script), fold], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["cursorMidTurn"] == "2.3"
    assert result["replayed"] == [False, False, False, True, True]
    assert result["draft"] == "<1><2><3><4><5>"
    assert result["cursorAfter"] == 3  # the turn ended: an event's seq again
    assert result["late"] is False
    assert result["nextTurn"] is True and result["nextDraft"] == "<1>"
    assert result["texts"][0] == "<1><2><3><4><5>"
