"""The only code that reaches past ASGI and Python's allocator, both for the streams' sake, and
both off with FERRYMAN_STREAM_SHORTCUTS=false:

- `uvicorn_direct_write`: a feed writes what comes for a parked stream straight to uvicorn's
  transport (`Feed.park`), instead of waking the stream's task to go through ASGI `send`. At
  1,000 streams of one feed, that task and its response's send path were half the cost of a
  delivery.
- `malloc_trim`: glibc's, called after feeds close, so a process that once held many feeds'
  events gives the heap's free pages back instead of staying that big.

Off, every frame goes through the response's `send` and nothing calls malloc_trim; the streams
deliver the same frames either way (tests/test_streams.py runs with both).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

# Writes a chunk to a stream's connection now, if the connection can take it (its buffer under
# the high-water mark, the client still there); False, writing nothing, if not.
DirectWrite = Callable[[bytes], bool]


def uvicorn_direct_write(connection: object) -> DirectWrite | None:
    """A write straight to the connection of uvicorn's httptools request cycle, framed as its
    `send` frames a chunk of a chunked response, and refused (False) whenever `send` would
    wait or drop it: the transport over its high-water mark, the client gone. None for any
    other server or response, whose streams then take the ASGI path alone.

    uvicorn's own objects, not ASGI: every stream test runs on a real uvicorn, so on these
    bytes; `tests/test_direct_writes.py` fails if the path is never taken."""
    if type(connection).__module__ != "uvicorn.protocols.http.httptools_impl":
        return None
    transport = getattr(connection, "transport", None)
    flow = getattr(connection, "flow", None)
    if (
        transport is None
        or flow is None
        or getattr(connection, "chunked_encoding", None) is not True
    ):
        return None

    def write(chunk: bytes) -> bool:
        if flow.write_paused or getattr(connection, "disconnected", True) or transport.is_closing():
            return False
        transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return True

    return write


def malloc_trim() -> Callable[[], int] | None:
    """A call that gives the heap's free pages back to the OS (glibc's `malloc_trim(0)`), or
    None without glibc (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return functools.partial(trim, 0)
