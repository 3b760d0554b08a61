"""Measurement scripts (benchmarks, not tests)."""
