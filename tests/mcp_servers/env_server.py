"""An MCP server over stdio whose one tool, `environment`, returns the environment it was
started with (as a JSON object): what a worker hands its stdio MCP servers.

Run:  python -m tests.mcp_servers.env_server
"""

from __future__ import annotations

import json
import os

from mcp.server.mcpserver import MCPServer

server: MCPServer = MCPServer("env", version="1.0", log_level="WARNING")


@server.tool()
def environment() -> str:
    """This process's environment variables, as a JSON object."""
    return json.dumps(dict(os.environ))


if __name__ == "__main__":
    server.run("stdio")
