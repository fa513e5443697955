"""SSE: backlog + live merge by cursor, framing, keep-alives."""
