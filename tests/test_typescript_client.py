"""The TypeScript client package, clients/typescript (`@ferryman/client`), built as its users
would get it: npm ci from its lockfile, its types generated from docs/openapi.json (drift
fails), `tsc --strict`, and its own tests under Node's test runner (clients/typescript/test/)
against a real API server (keys mode) and worker, through a proxy that cuts every stream a few
KB in and drops connections on cue, across API restarts and worker SIGKILLs (the JavaScript
asks a control server for them); then `npm pack`, and a fresh project installs the tarball
offline and imports it.

Without node >= 20 and npm these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_protocol_js import Stack, control_server, running_stack
from tests.npm import Node, node_tools
from tests.support import REPO
from tests.test_agent_protocol_js import failures, passed
from tests.test_owner_session_client import Proxy

pytestmark = [pytest.mark.timeout(420)]

PACKAGE = Path(REPO) / "clients" / "typescript"
GENERATED = PACKAGE / "src" / "openapi.ts"
DOCUMENT = Path(REPO) / "docs" / "openapi.json"
GUIDE = Path(REPO) / "docs" / "typescript.md"
WEB_BUNDLE = Path(REPO) / "app" / "web" / "ferryman-client.js"
WHAT = "the TypeScript client's tests"
MIN_NODE = (20, 0)
NODE_TIMEOUT = 360
# Cut each stream's answer after this many bytes: a few events, then a reconnect.
CUT_AFTER = 3000
TESTS = {
    "rest.test.mjs": [
        "sessions: create, list, get, rename, messages, transcript, cancel, delete",
        "approvals, tools and problems with fields",
        "assistants: create, list, get, update, versions, a session of one, delete",
        "fork and edit, retry from a message, compact",
        "a wrong key and an unreachable server",
    ],
    "streams.test.mjs": [
        "a session stream cut every few KB shows every event once, and folds as its transcript",
        "a worker SIGKILL mid-tool and an API restart: the session stream shows each event once",
        "the owner stream through cuts, drops and an API restart: every event once, as a clean"
        " replay has them",
    ],
    "live.test.mjs": [
        "the picture through cuts, drops, an API restart and a worker SIGKILL is the server's",
        "resync_required (a cursor ahead of the server) takes a new snapshot at once",
        "an event about a session it does not know takes a new snapshot",
        "five malformed events take a new snapshot; four do not",
        "a snapshot every reconcile interval, jittered, while connected",
        "failed reconnects turn the health signal off, and a reconnect on again",
        "cancel takes 409 as already terminal",
        "a wrong key fails the first snapshot",
        "a range: a filtered page at a time, and sessions moving into and out of it",
    ],
    "fold.test.mjs": [
        "each durable event twice is once",
        "a reconnect that replays changes nothing",
        "any prefix twice is once",
        "a stream folds as its transcript",
        "a resume fails exactly its repaired calls",
        "numbered deltas replayed after a reconnect repeat no text",
        "streamed text is replaced by the final message",
        "tool calls go through their states",
        "a delegate call runs with its child until the parent answers it",
        "every delegate call keeps its child, whatever comes after",
        "a delta of a turn that ended or was dropped is stale; the cursor holds a turn's chunks",
        "a compaction is listed and every message before it kept",
    ],
    "sse.test.mjs": ["frames are the same whatever the cuts and line ends"],
}


def run(node: Node, *args: str, cwd: Path = PACKAGE, timeout: float = 180) -> str:
    """An npm/npx command (or node) in `cwd`; its output, or a failure that shows it."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def bin_(name: str) -> str:
    return str(PACKAGE / "node_modules" / ".bin" / name)


@pytest.fixture(scope="module")
def built() -> Node:
    """npm ci from the lockfile, then tsc's ES modules in dist/ (what the tests import)."""
    node = node_tools(PACKAGE, WHAT, MIN_NODE)
    run(node, bin_("tsc"), "--project", "tsconfig.json")
    return node


def test_generated_types_match_the_document(built: Node, tmp_path: Path) -> None:
    """src/openapi.ts is openapi-typescript's output for docs/openapi.json, as committed."""
    fresh = tmp_path / "openapi.ts"
    run(built, bin_("openapi-typescript"), str(DOCUMENT), "--output", str(fresh))
    assert fresh.read_text() == GENERATED.read_text(), (
        "clients/typescript/src/openapi.ts is stale:"
        " run `npm run generate --prefix clients/typescript`"
    )


def test_the_workbench_bundle_is_the_package_as_committed(built: Node, tmp_path: Path) -> None:
    """app/web/ferryman-client.js is `npm run web`'s bundle of src/, as committed: the workbench
    loads the package itself, with no build step at run time."""
    fresh = tmp_path / "ferryman-client.js"
    script = json.loads((PACKAGE / "package.json").read_text())["scripts"]["web"]
    assert script.endswith("--outfile=../../app/web/ferryman-client.js"), script
    command = script.replace("--outfile=../../app/web/ferryman-client.js", f"--outfile={fresh}")
    run(built, "sh", "-c", command.replace("esbuild", bin_("esbuild"), 1))
    assert fresh.read_text() == WEB_BUNDLE.read_text(), (
        "app/web/ferryman-client.js is stale: run `make web-client`"
    )


def test_it_type_checks_under_strict(built: Node) -> None:
    run(built, bin_("tsc"), "--project", "tsconfig.json", "--strict", "--noEmit")
    config = json.loads((PACKAGE / "tsconfig.json").read_text())
    assert config["compilerOptions"]["strict"] is True


@pytest.fixture(scope="module")
def served(isolated_db: str) -> Iterator[Stack]:
    with running_stack(isolated_db) as stack:
        yield stack


async def test_the_package_against_a_real_server(built: Node, served: Stack) -> None:
    loop = asyncio.get_running_loop()
    streams = (b"/owner-events", b"/events")
    async with Proxy(served.api.port, cut_after=CUT_AFTER, streams=streams) as proxy:

        def down() -> None:
            proxy.down = True

        def up() -> None:
            proxy.down = False

        more = {
            "/proxy-drop": lambda: loop.call_soon_threadsafe(proxy.drop),
            "/proxy-down": down,
            "/proxy-up": up,
        }
        with control_server(served, more) as control_url:
            env = {
                **{k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")},
                "FERRYMAN_URL": served.api.url,
                "FERRYMAN_PROXY_URL": proxy.url,
                "FERRYMAN_API_KEY": served.key,
                "FERRYMAN_CONTROL_URL": control_url,
            }
            proc = await asyncio.create_subprocess_exec(
                built.node,
                "--test",
                "--test-concurrency=1",
                "--test-timeout=120000",
                "--test-reporter=tap",
                *(f"test/{name}" for name in TESTS),
                cwd=PACKAGE,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), NODE_TIMEOUT)
    tap, errors = out.decode(), err.decode()
    report = f"{failures(tap)}\n{errors[-4000:]}"
    report += f"\n{served.logs()}" if proc.returncode else ""
    assert proc.returncode == 0, f"node --test exited {proc.returncode}:\n{report}"
    assert sorted(passed(tap)) == sorted(t for names in TESTS.values() for t in names), report
    assert proxy.cuts > 0, "no stream was cut"
    assert any(b"last-event-id:" in head.lower() for head in proxy.heads)


def guide_script() -> str:
    """The first js block of docs/typescript.md's "A first script"."""
    guide = GUIDE.read_text()
    found = re.search(r"```js\n(.*?)```", guide[guide.index("## A first script") :], re.S)
    assert found, "no js block in docs/typescript.md's first script"
    return found.group(1)


def test_npm_pack_installs_offline_and_imports(built: Node, served: Stack, tmp_path: Path) -> None:
    """The tarball holds dist/ (ES modules and .d.ts); a fresh project installs it from the
    file alone (no runtime dependencies, so offline), imports it, type-checks a use, and runs
    the guide's first script against a server as the guide says it does."""
    packed = json.loads(
        run(built, built.npm, "pack", "--json", "--pack-destination", str(tmp_path))
    )
    tarball = tmp_path / packed[0]["filename"]
    files = {f["path"] for f in packed[0]["files"]}
    assert {"dist/index.js", "dist/index.d.ts", "dist/live.js", "package.json"} <= files, files
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(
        json.dumps({"name": "app", "private": True, "type": "module"})
    )
    run(built, built.npm, "install", "--offline", "--no-audit", "--no-fund", str(tarball), cwd=app)
    script = (
        "import { Ferryman, OwnerSessionClient, SessionFold, NotFoundError }"
        " from '@ferryman/client';"
        "const f = new Ferryman({ baseUrl: 'http://127.0.0.1:1' });"
        "new OwnerSessionClient(f); new SessionFold();"
        "console.log(f.baseUrl, typeof NotFoundError);"
    )
    out = run(built, built.node, "--input-type=module", "-e", script, cwd=app)
    assert out.strip() == "http://127.0.0.1:1 function"
    (app / "use.ts").write_text(
        "import { Ferryman, type Session } from '@ferryman/client';\n"
        "const client = new Ferryman({ apiKey: 'k' });\n"
        "export async function titles(): Promise<string[]> {\n"
        "  const page = await client.listSessions({ status: 'running' });\n"
        "  return page.sessions.map((s: Session) => s.title);\n"
        "}\n"
    )
    options = ["--strict", "--noEmit", "--module", "nodenext", "--moduleResolution", "nodenext"]
    run(
        built, bin_("tsc"), *options, "--target", "es2022", "--lib", "es2022,dom", "use.ts", cwd=app
    )
