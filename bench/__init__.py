"""Benchmarks (not part of the package or the test suite)."""
