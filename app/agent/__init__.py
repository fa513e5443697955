"""The agent loop's pure parts (conversation, resume planning) and its plug-ins (models, tools).
Knows nothing of HTTP or SQL."""
