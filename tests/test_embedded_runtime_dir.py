"""The embedded server's runtime directory (its lock, sometimes its trust-auth socket) lives in
the shared temporary directory when XDG_RUNTIME_DIR is unset: one another user made first, or a
symlink planted there, is refused, and `ferryman` says so in one line."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from app.db.embedded import UnsafeRuntimeDir, _runtime_dir
from tests.support import REPO, missing


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary directory `_runtime_dir` uses, and so where it makes its own."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def planted(tmp: Path) -> Path:
    return tmp / f"ferryman-runtime-{os.getuid()}"


def test_made_private_when_missing(tmp: Path) -> None:
    path = _runtime_dir()
    assert path == planted(tmp)
    assert stat.S_IMODE(path.lstat().st_mode) == 0o700
    assert _runtime_dir() == path  # and taken again by the next process


def test_refused_when_others_can_enter_it(tmp: Path) -> None:
    planted(tmp).mkdir(mode=0o700)
    planted(tmp).chmod(0o755)
    with pytest.raises(UnsafeRuntimeDir, match="has mode 755: other users can enter it"):
        _runtime_dir()


def test_refused_when_a_symlink(tmp: Path) -> None:
    elsewhere = tmp / "theirs"
    elsewhere.mkdir(mode=0o700)
    planted(tmp).symlink_to(elsewhere)
    with pytest.raises(UnsafeRuntimeDir, match=r"is not a directory \(a symlink\?\)"):
        _runtime_dir()


def test_refused_when_another_users(tmp: Path) -> None:
    if os.geteuid() != 0:
        missing("only root can give a directory to another user", "this test, as root")
    nobody = pwd.getpwnam("nobody").pw_uid
    planted(tmp).mkdir(mode=0o700)
    os.chown(planted(tmp), nobody, -1)
    with pytest.raises(UnsafeRuntimeDir, match=f"belongs to uid {nobody}, not to this user"):
        _runtime_dir()


def test_worker_refuses_to_start_on_it(tmp_path: Path) -> None:
    (tmp_path / f"ferryman-runtime-{os.getuid()}").mkdir(mode=0o777)
    (tmp_path / f"ferryman-runtime-{os.getuid()}").chmod(0o777)
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    env |= {"DATABASE_URL": "", "TMPDIR": str(tmp_path), "FERRYMAN_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "app", "worker"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "has mode 777: other users can enter it" in lines[0]
    assert "set XDG_RUNTIME_DIR" in lines[0]
    assert not (tmp_path / "pg").exists()  # refused before any server started
