"""Other protocols served over Ferryman's sessions, each a thin HTTP layer over store/ and the
streams: `agent_protocol` (the LangGraph SDKs')."""
