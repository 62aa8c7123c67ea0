"""Benchmarks reproducing the papers' experiments; run as ``python -m benchmarks.<name>``."""
