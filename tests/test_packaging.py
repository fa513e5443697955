"""Packaging: the migrations live in the top-level alembic/, which never shadows the Alembic
library, and ship in the wheel, so `pip install .` then `ferryman migrate` works without a
checkout (and `pip install -e .` finds them in the checkout)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import alembic
import psycopg
import pytest

from app.db import migrate
from tests import support

REPO = Path(support.REPO)
# What the Dockerfile copies before `pip install .`: a wheel built from these alone must work.
SOURCES = ("pyproject.toml", "README.md", "app", "alembic")
TIMEOUT = 300
pytestmark = pytest.mark.once  # builds and installs a wheel: CI runs it on one PostgreSQL
# The Alembic library, as this process imported it (its own test below checks it is no folder of
# the checkout).
LIBRARY = Path(alembic.__file__ or "").parent


def run(args: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env if env is not None else clean_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr[-4000:]}"
    return result.stdout


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would put the checkout on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["FERRYMAN_LOG_FORMAT"] = "console"
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the files a build reads, so building leaves nothing (build/, stale files)
    in the checkout."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(
                REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
        else:
            shutil.copy2(REPO / name, src / name)
    return src


@pytest.fixture(scope="module")
def wheel(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, source], cwd=dist)
    (built,) = dist.glob("ferryman-*.whl")
    return built


def new_venv(where: Path, install: list[str | Path]) -> Path:
    """A fresh virtualenv with Ferryman installed by `pip install --no-deps *install`. Its
    dependencies come from the test run's own site-packages, appended after its own by a .pth
    file: that directory is not a site directory, so the .pth files in it (an editable install
    of the checkout among them) are not run, and `app` can only come from the new install."""
    venv = where / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=where)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q"]
    run([*pip, *install], cwd=where)
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], where)
    ours = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (Path(purelib.strip()) / "ferryman_test_deps.pth").write_text("\n".join(ours) + "\n")
    return venv


def where_things_are(venv: Path, cwd: Path) -> dict[str, Path]:
    code = (
        "import alembic, app\n"
        "from app.db import migrate\n"
        "print(app.__file__, alembic.__file__, migrate.migrations_dir(), sep='\\n')\n"
    )
    out = run([venv / "bin" / "python", "-c", code], cwd).split()
    return dict(zip(("app", "alembic", "migrations"), map(Path, out), strict=True))


def migrates(venv: Path, cwd: Path) -> None:
    """`ferryman migrate`, run from `cwd`, takes an empty database to the head revision."""
    head = migrate.head_revision()
    assert head
    with support.empty_database("ferryman_pkg") as url:
        out = run([venv / "bin" / "ferryman", "migrate"], cwd, clean_env(DATABASE_URL=url))
        assert f"revision {head}" in out
        with psycopg.connect(url) as conn:
            versions = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    assert versions == [(head,)]


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """An empty working directory outside the checkout."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return cwd


def test_the_wheel_carries_every_file_of_app_and_the_migrations(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())

    def files(top: str) -> set[str]:
        return {
            p.relative_to(REPO / top).as_posix()
            for p in (REPO / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    # pyproject.toml lists the packages one by one: a new one left out would be missing here.
    assert {f"app/{f}" for f in files("app")} - names == set()
    assert {f"app/migrations/{f}" for f in files("alembic")} - names == set()
    assert "app/migrations/versions/0001_foundation.py" in names
    # Nothing lands beside the Alembic library in site-packages.
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"app"}


def test_pip_install_then_ferryman_migrate_works_without_a_checkout(
    wheel: Path, tmp_path: Path, elsewhere: Path
) -> None:
    venv = new_venv(tmp_path, [wheel])
    found = where_things_are(venv, elsewhere)
    assert found["app"].is_relative_to(venv)
    assert found["migrations"].is_relative_to(venv)
    assert found["migrations"] == found["app"].parent / "migrations"
    assert found["alembic"] == LIBRARY / "__init__.py"
    migrates(venv, elsewhere)


def test_an_editable_install_migrates_from_the_checkout(
    source: Path, tmp_path: Path, elsewhere: Path
) -> None:
    venv = new_venv(tmp_path, ["-e", source])
    found = where_things_are(venv, elsewhere)
    assert found["app"] == source / "app" / "__init__.py"
    assert found["migrations"] == source / "alembic"
    assert found["alembic"] == LIBRARY / "__init__.py"
    migrates(venv, elsewhere)


def test_the_alembic_folder_never_shadows_the_alembic_library() -> None:
    assert (REPO / "alembic" / "env.py").is_file()
    assert list((REPO / "alembic").rglob("__init__.py")) == []
    # This process has the checkout on sys.path (pytest's rootdir), and so does a Python
    # started in the checkout: both import the library.
    assert LIBRARY != REPO / "alembic"
    assert (LIBRARY / "command.py").is_file()
    code = "import alembic.command; print(alembic.__file__)"
    out = run([sys.executable, "-c", code], cwd=REPO)
    assert Path(out.strip()).parent == LIBRARY
    # `python -m alembic` from the checkout is the library too, and alembic.ini finds the scripts.
    heads = run([sys.executable, "-m", "alembic", "heads"], cwd=REPO)
    assert f"{migrate.head_revision()} (head)" in heads
