"""The server's `ferryman` commands (app/cli/server.py). The `ferryman` command itself belongs
to the client distribution (ferryman-client, `ferryman.cli`); this distribution adds its
commands through the `ferryman.cli` entry point (pyproject.toml)."""
