"""Benchmarks for shmq beside its peers; run ``python -m bench`` from the repository root."""
