"""Builds the optional C hot paths (shmq/engine/_fast.c, the server's plain requests shmq/server/_plain.c,
the clients' shmq/protocol/_wire.c, shmq/kafka/_records.c); the metadata is in pyproject.toml.

``optional=True``: where it cannot be compiled, shmq installs without it and runs its
pure-Python paths (``shmq.engine.queues.queue.FAST`` says which).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("shmq.engine._fast", ["shmq/engine/_fast.c"], depends=["shmq/engine/_layout.h", "shmq/engine/_fast_api.h"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("shmq.server._plain", ["shmq/server/_plain.c"],
                             depends=["shmq/engine/_fast_api.h", "shmq/protocol/_wire.h", "shmq/protocol/_frames.h",
                                      "shmq/server/_reply_budget.h"], optional=True,
                             extra_compile_args=["-O2"]),
                   Extension("shmq.protocol._wire", ["shmq/protocol/_wire.c"],
                             depends=["shmq/protocol/_wire.h", "shmq/protocol/_frames.h"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("shmq.kafka._records", ["shmq/kafka/_records.c"], optional=True,
                             extra_compile_args=["-O2"])])
