"""Run llama.cpp's own HTTP server (from the `xllamacpp` wheel) in a child process for tests.

The child is this very file run as a script: `python tests/llm/server.py --model M --port 0`.
It prints one line, ``listening http://127.0.0.1:PORT``, once the server listens, and then runs
until its stdin closes (the parent closed it, or died). Being a process of its own, a test can
SIGKILL it (a crash), SIGSTOP it (a stall: connections stay open, nothing moves) and SIGCONT it,
or start it again on the same port (a restart that clients see at the same URL).

    with llama_server(write_tiny_model(tmp_path / "m.gguf")) as llm:
        httpx.post(llm.base_url + "/chat/completions", json=...)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LISTENING = "listening "


def xllamacpp_missing() -> str | None:
    """Why the real-model tests cannot run here, or None when they can."""
    missing = [m for m in ("xllamacpp", "gguf", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        return f"not installed: {', '.join(missing)} (pip install xllamacpp gguf numpy)"
    return None


def require_xllamacpp() -> None:
    """Skip the calling test without xllamacpp; fail it instead under CI, where it must run."""
    from tests.support import missing  # only tests call this, never the child process

    reason = xllamacpp_missing()
    if reason is not None:
        missing(reason, "the real-model tests")


@dataclass(frozen=True)
class ServerOptions:
    # The tiny model tokenizes most prompt text byte by byte, so a prompt costs about one token
    # per byte: 8192 leaves room for a few tool schemas and a short history.
    n_ctx: int = 8192
    n_parallel: int = 2
    threads: int = 2
    # Without a context shift a long "tick" stream would end when the context is full; with it
    # the stream runs until max_tokens.
    ctx_shift: bool = True
    start_timeout: float = 30.0


def _log_file() -> Path:
    fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
    os.close(fd)
    return Path(name)


@dataclass
class LlamaServer:
    """A llama.cpp server child process. ``start()`` it, or use ``llama_server(...)``."""

    model_path: Path
    options: ServerOptions = field(default_factory=ServerOptions)
    port: int = 0  # 0: an ephemeral port, chosen by the first start and kept by restarts
    log_path: Path = field(default_factory=_log_file)  # llama.cpp's log, appended on restarts
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``: llama.cpp's own endpoints (/health, /slots, /metrics)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ``http://127.0.0.1:PORT/v1``."""
        return self.origin + "/v1"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "server not started"
        return self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> LlamaServer:
        """Start the child and wait until it answers ``/health``. Raises if it cannot start."""
        assert not self.running(), "already running"
        opts = self.options
        cmd = [sys.executable, str(Path(__file__).resolve()), "--model", str(self.model_path)]
        cmd += ["--port", str(self.port), "--n-ctx", str(opts.n_ctx)]
        cmd += ["--parallel", str(opts.n_parallel), "--threads", str(opts.threads)]
        cmd += [] if opts.ctx_shift else ["--no-ctx-shift"]
        deadline = time.monotonic() + opts.start_timeout
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
            )
        assert self._proc.stdout is not None
        # The child prints nothing before it listens, then exactly one line.
        ready, _, _ = select.select([self._proc.stdout], [], [], opts.start_timeout)
        line = self._proc.stdout.readline().decode() if ready else ""
        if not line.startswith(LISTENING):
            self.kill()
            raise RuntimeError(f"llama server did not start: {self._log_tail()}")
        self.port = int(line.rsplit(":", 1)[1])
        while not self._healthy():
            if time.monotonic() > deadline or not self.running():
                self.kill()
                raise RuntimeError(f"llama server never became healthy: {self._log_tail()}")
            time.sleep(0.02)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.origin + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        """SIGKILL: a crash. Open streams are cut without a final chunk or ``[DONE]``."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()  # works on a SIGSTOPped process too
            self._proc.wait()
        self._release()

    def stop(self) -> None:
        """SIGSTOP: a stall. Connections stay open and accept bytes; nothing answers."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def cont(self) -> None:
        """SIGCONT: resume after ``stop()``."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Kill the server and start a fresh one on the same port (same ``base_url``)."""
        self.kill()
        self.start()

    def close(self) -> None:
        """End the child: closing its stdin makes it exit; SIGKILL if it does not."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
        self.kill()

    def _release(self) -> None:
        assert self._proc is not None
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                pipe.close()


@contextlib.contextmanager
def llama_server(
    model_path: Path,
    *,
    port: int = 0,
    n_ctx: int = ServerOptions.n_ctx,
    n_parallel: int = ServerOptions.n_parallel,
    threads: int = ServerOptions.threads,
    ctx_shift: bool = ServerOptions.ctx_shift,
    start_timeout: float = ServerOptions.start_timeout,
) -> Iterator[LlamaServer]:
    """Run a llama.cpp server on ``model_path`` (port 0: an ephemeral one) during the block.

    llama.cpp's log (``server.log_path``) is kept only when the block raised.
    """
    options = ServerOptions(n_ctx, n_parallel, threads, ctx_shift, start_timeout)
    server = LlamaServer(Path(model_path), options, port=port)
    try:
        yield server.start()
    except BaseException:
        server.close()
        raise
    server.close()
    server.log_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    """The child process: start llama.cpp's server in-process, announce its address, wait."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--n-ctx", type=int, default=ServerOptions.n_ctx)
    parser.add_argument("--parallel", type=int, default=ServerOptions.n_parallel)
    parser.add_argument("--threads", type=int, default=ServerOptions.threads)
    parser.add_argument("--no-ctx-shift", action="store_true")
    args = parser.parse_args(argv)

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.port = args.port
    params.use_jinja = True  # the tool-call parser needs the GGUF's Jinja template
    params.n_ctx = args.n_ctx
    params.n_parallel = args.parallel
    params.kv_unified = True  # any one request may use the whole context
    params.ctx_shift = not args.no_ctx_shift
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.warmup = False  # nothing to warm up in a bigram machine; saves start time
    server = xllamacpp.Server(params)  # returns once the HTTP server listens
    # stdout carries only this line; llama.cpp logs to stderr.
    print(LISTENING + server.listening_address, flush=True)
    # The parent holds our stdin open: EOF means it is gone (even SIGKILLed), so do not outlive
    # it. _exit skips joining llama.cpp's threads, which would never end.
    sys.stdin.buffer.read()
    os._exit(0)


if __name__ == "__main__":
    main()
