"""The runtime: workers (claim loop, heartbeats, shutdown) and the runner (one run)."""
