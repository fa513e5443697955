"""node and npm for the tests that run JavaScript: a package of tests/ installed by `npm ci` as
its package-lock.json pins it, or a skip (a failure under CI=true) that names what is missing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support import missing


@dataclass(frozen=True)
class Node:
    node: str
    npm: str


def node_tools(package: Path, what: str, min_node: tuple[int, int]) -> Node:
    """node (at least `min_node`) and npm, with `package`'s packages installed as its
    package-lock.json pins them (`npm ci`, skipped when they already are)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing(f"node and npm are needed for {what} (apt-get install nodejs npm)", what)
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    found = re.match(r"v(\d+)\.(\d+)\.", version)
    if found is None or (int(found[1]), int(found[2])) < min_node:
        wanted = ".".join(map(str, min_node))
        missing(f"{what} needs node >= {wanted}, not {version!r}", what)
    if not installed_as_locked(package):
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=package,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode != 0:
            missing(f"npm ci in {package} failed:\n{done.stdout}\n{done.stderr}", what)
    return Node(node, npm)


def installed_as_locked(package: Path) -> bool:
    """node_modules holds what package-lock.json pins (npm's record of the installed tree,
    node_modules/.package-lock.json, lists the same packages), so `npm ci` would change nothing."""
    try:
        locked = json.loads((package / "package-lock.json").read_text())["packages"]
        installed = json.loads((package / "node_modules" / ".package-lock.json").read_text())
    except (OSError, ValueError, KeyError):
        return False
    return bool({k: v for k, v in locked.items() if k} == installed.get("packages"))
