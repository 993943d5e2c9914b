"""Builds the optional C hot path (shmq/_fast.c); the metadata is in pyproject.toml.

``optional=True``: where it cannot be compiled, shmq installs without it and runs its
pure-Python paths (``shmq.queue.FAST`` says which).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("shmq._fast", ["shmq/_fast.c"], optional=True, extra_compile_args=["-O2"])])
