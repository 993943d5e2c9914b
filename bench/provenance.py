"""Which code a saved run measured: the stamp every bench writes into its JSON (``"code"``),
and how a page's check tells that a run is older than the code it shows.

Strategy: a run names what it measures (``MEASURES``: a key per bench, each a list of
path patterns from the repository's root), and its stamp keeps a digest of each of those
files as the run found them, and the layout versions of queues and streams. A file's
digest is of its code, not its text: a Python module's syntax tree without docstrings,
a C, header or Java file without comments and with its whitespace collapsed; so a
comment or a docstring (or a Python that adds an empty field to its trees) does not age
a run, and any change the interpreter or the compiler sees does. ``changed(stamp)`` lists the files that differ from the tree now
(added, removed or edited), and a layout version that moved; ``bench.docs --check``
and tests/test_performance_page.py fail a page that shows such a run.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the engine: queues, streams, shared memory, the C paths; what every bench measures
_ENGINE = ["shmq/engine/**/*.py", "shmq/engine/_fast.c", "shmq/engine/*.h", "shmq/model/*.py",
           "shmq/errors.py", "shmq/serializers.py", "shmq/__init__.py"]
# the TCP path: the server, the clients, the wire (their C halves included)
_WIRE = ["shmq/server/*.py", "shmq/server/handlers/*.py", "shmq/server/*.c", "shmq/client/*.py", "shmq/protocol/*.py",
         "shmq/protocol/*.c", "shmq/protocol/*.h", "shmq/auth.py", "shmq/busypoll.py"]

# a run's key -> what it measures: shmq's code and the bench's own shmq adapters
MEASURES = {
    "matrix": [*_ENGINE, *_WIRE, "shmq/persistence/*.py", "bench/adapters/shmq_*.py"],
    "queues": [*_ENGINE, "bench/adapters/shmq_local.py"],
    "tcp": [*_ENGINE, *_WIRE, "bench/adapters/shmq_tcp.py"],
    "streams": [*_ENGINE, *_WIRE, "bench/adapters/shmq_stream.py"],
    "spark": [*_ENGINE, "shmq/spark/**/*.py", "shmq/spark/jvm/src/**/*.java", "bench/spark.py"],
    "jobs": [*_ENGINE, *_WIRE, "shmq/kombu/*.py", "shmq/celery/*.py", "shmq/dramatiq/*.py", "bench/job_apps.py"],
    "kafka": [*_ENGINE, *_WIRE, "shmq/kafka/*.py", "shmq/kafka/*.c", "shmq/server/kafka/*.py"],
    "memory": [*_ENGINE, "bench/memory.py"],
    "compaction": [*_ENGINE, "shmq/server/housekeeper.py", "bench/compaction.py"],
    "arrays": [*_ENGINE, "bench/arrays.py"],
}

_C_COMMENT = re.compile(rb"/\*.*?\*/|//[^\n]*", re.S)


def _code(path: str) -> bytes:
    """What of a file the digest covers (see the module's Strategy)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if path.endswith(".py"):
        tree = ast.parse(raw, path)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
                body[:1] = [] if len(body) > 1 else [ast.Pass()]  # a docstring
        return _canonical(tree).encode()
    return b" ".join(_C_COMMENT.sub(b" ", raw).split())


def _canonical(node) -> str:
    """A syntax tree as text, leaving out empty and None fields, so that fields a newer
    Python adds empty (``type_params`` in 3.12) leave a digest as it was."""
    if isinstance(node, ast.AST):
        fields = ", ".join(f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
                           if value is not None and value != [])
        return f"{type(node).__name__}({fields})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(item) for item in node) + "]"
    return repr(node)


def files(what: str, root: str = ROOT) -> list[str]:
    """The files run ``what`` measures, as paths from ``root``, sorted."""
    found = set()
    for pattern in MEASURES[what]:
        found.update(glob.glob(os.path.join(root, pattern), recursive=True))
    return sorted(os.path.relpath(p, root) for p in found if os.path.isfile(p))


def layouts() -> dict:
    """The layout versions of this tree's queues and streams."""
    from shmq.engine.shm import layout

    return {"queue": layout.LAYOUT_VERSION, "stream": layout.STREAM_VERSION}


def stamp(what: str, root: str = ROOT) -> dict:
    """The ``"code"`` of a run of ``what``: its key, the layouts, each measured file's digest."""
    if what not in MEASURES:
        raise KeyError(f"unknown run {what!r}; choose from {', '.join(MEASURES)}")
    digests = {p: _digest(os.path.join(root, p)) for p in files(what, root)}
    return {"measures": what, "layouts": layouts(), "files": digests}


_digests: dict = {}  # (a file's kind, its bytes' sha256) -> its digest: a check stamps the same files for each run


def _digest(path: str) -> str:
    """A file's digest (of ``_code``), made once per content in this process."""
    with open(path, "rb") as fh:
        key = (path.endswith(".py"), hashlib.sha256(fh.read()).digest())
    got = _digests.get(key)
    if got is None:
        got = _digests[key] = hashlib.sha256(_code(path)).hexdigest()[:16]
    return got


def run_header(measures: str, command: str) -> dict:
    """What opens every saved run: its date (UTC), the command, the code stamp."""
    import datetime

    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "code": stamp(measures)}


def changed(code: dict | None, root: str = ROOT) -> list[str]:
    """What moved since a run stamped ``code``: each file added, removed or edited, and a
    layout version; ``["no code stamp"]`` for a run that has none."""
    if not code:
        return ["no code stamp (a run older than the stamps)"]
    now = stamp(code["measures"], root)
    out = [f"{kind} layout {code['layouts'].get(kind)} -> {v}" for kind, v in now["layouts"].items()
           if code["layouts"].get(kind) != v]
    before, after = code["files"], now["files"]
    out += [f"{p} (new)" for p in after if p not in before]
    out += [f"{p} (removed)" for p in before if p not in after]
    out += [p for p in after if p in before and before[p] != after[p]]
    return out
