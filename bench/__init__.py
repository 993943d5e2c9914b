"""Benchmarks for shmq; run ``python -m bench.local`` from the repository root."""
