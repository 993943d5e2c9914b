"""Which code a saved run measured: the stamp every bench writes into its JSON (``"code"``),
and how a page's check tells that a run is older than the code it shows.

Strategy: a run names what it measures (``MEASURES``: a key per bench, each a list of
path patterns from the repository's root), and its stamp keeps a digest of each of those
files as the run found them, and the layout versions of queues and streams. A file's
digest is of its code, not its text: a Python module's syntax tree without docstrings,
a C, header or Java file without comments and with its whitespace collapsed; so a
comment or a docstring (or a Python that adds an empty field to its trees) does not age
a run, and any change the interpreter or the compiler sees does. ``changed(stamp)`` lists the files that differ from the tree now
(added, removed or edited), and a layout version that moved: ``bench.docs --check``
names such a run for whoever is about to publish figures. A stamp also keeps the commit
the run was made on (``+`` after it: with uncommitted changes to what it measures), which
a page shows beside the run's date. What the test suite holds a run to (``expired``) is
less: a stamp, the current layouts, and an age of at most ``MAX_AGE_DAYS``; a change to
measured code that does not mean to change speed lands without a rerun.
"""

from __future__ import annotations

import ast
import datetime
import glob
import hashlib
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the engine: queues, streams, shared memory, the C paths; what every bench measures
_ENGINE = ["shmq/engine/**/*.py", "shmq/engine/_fast.c", "shmq/engine/*.h", "shmq/formats/*.py", "shmq/model/*.py",
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

MAX_AGE_DAYS = 14  # a saved run older than this fails the suite: run its command again

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
    measured = files(what, root)
    digests = {p: _digest(os.path.join(root, p)) for p in measured}
    return {"measures": what, "commit": commit(root, measured), "layouts": layouts(), "files": digests}


def commit(root: str = ROOT, measured=()) -> str | None:
    """The commit the tree at ``root`` is on (12 hex digits), with ``+`` when any of
    ``measured`` differs from it; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                              timeout=30)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *measured], cwd=root, capture_output=True,
                               text=True, timeout=30).stdout.strip() if measured else ""
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+" if dirty else "")


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


def expired(date: str | None, code: dict | None, today: datetime.date | None = None) -> list[str]:
    """Why a saved run may no longer stand on a page (the suite's rule): it has no code
    stamp, a layout it measured is not the current one, or it is older than
    ``MAX_AGE_DAYS``. Code that moved since is ``changed``'s business, not this one's."""
    if not code:
        return ["no code stamp (a run older than the stamps)"]
    out = [f"{kind} layout {code['layouts'].get(kind)} -> {v}" for kind, v in layouts().items()
           if code["layouts"].get(kind) != v]
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    try:
        age = (today - datetime.date.fromisoformat((date or "")[:10])).days
    except ValueError:
        return out + ["no date"]
    if age > MAX_AGE_DAYS:
        out.append(f"{age} days old (at most {MAX_AGE_DAYS})")
    return out


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
