"""The layers and the imports allowed between them; a TCP client that loads no
shared-memory code.

The rules are the three tables below, written once (docs/DESIGN.md, "Layers", quotes
them): FLOORS, lowest first, where a module imports nothing of a higher floor; a module
of a package in MAY_IMPORT imports only modules of shmq under the prefixes listed for it;
a module of a package in MAY_NOT_IMPORT none under those listed. "Imports" counts every
import statement in the file, at module level or in a function: a function-level import
is a dependency too, only a later one.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import shmq

ROOT = Path(shmq.__file__).parent

# the floors, lowest first: a module imports only from its own floor and the floors below
# (the longest prefix names a module's floor; a wing imports its sibling: both are one floor)
FLOORS = (
    ("shmq.errors",),
    # values, checks and host facts, below everything that acts
    ("shmq.model", "shmq.sharing", "shmq.serializers", "shmq.auth", "shmq.busypoll", "shmq.logs", "shmq.tls",
     "shmq.logind", "shmq.mirrors"),
    # the codecs, sans-IO: the DEADBEEF wire, Kafka's, and the bytes on disk
    ("shmq.protocol", "shmq.kafka", "shmq.formats"),
    # the engine: its shared-memory base, its two wings, and its faces (Broker, the asyncio
    # face, doze and its doorbells, the keyed stores)
    ("shmq.engine.shm", "shmq.engine._fast"),  # (the C twin of the base's and the wings' paths: it imports nothing)
    ("shmq.engine.queues", "shmq.engine.streams"),
    ("shmq.engine",),
    # on the engine: snapshots, logs replayed, backups; beside it, the TCP clients
    ("shmq.persistence", "shmq.client"),
    # the server, and the stream producer (on either transport)
    ("shmq.server", "shmq.producer"),
    # a local broker's transactional producer: the TCP client to the namespace's server
    ("shmq.transactional",),
    # the faces and the adapters: shmq's own names, the CLI, doctor, the integrations
    ("shmq.__main__", "shmq.aio", "shmq.cli", "shmq.doctor", "shmq.views", "shmq.kombu", "shmq.celery",
     "shmq.dramatiq", "shmq.mp", "shmq.spark"),
)
MAY_IMPORT = {
    # values and checks, below all: Message, QueueStats, Record, headers, limits, keepalive
    "shmq.model": ("shmq.model", "shmq.errors"),
    # the DEADBEEF codec: sans-IO, it knows no engine
    "shmq.protocol": ("shmq.protocol", "shmq.model", "shmq.errors"),
    # Kafka's wire protocol: sans-IO too, beside the DEADBEEF codec
    "shmq.kafka": ("shmq.kafka", "shmq.model", "shmq.errors"),
    # the bytes on disk: files and formats, nothing of shared memory
    "shmq.formats": ("shmq.formats", "shmq.errors", "shmq.sharing"),
}
MAY_NOT_IMPORT = {
    # the TCP clients: a remote process needs no shared memory
    "shmq.client": ("shmq.engine", "shmq.server", "shmq.persistence"),
    # the engine knows nothing of the wire, the clients, the server, snapshots
    "shmq.engine": ("shmq.protocol", "shmq.client", "shmq.server", "shmq.persistence"),
}
# the root package: Python loads it before any module of it, so a name taken from it
# (``__version__``, ``connect``) adds no dependency a module did not have
ROOT_PACKAGE = "shmq"

# the names whose modules a remote client must never load
LOCAL_ONLY = ("posix_ipc", "shmq.engine")

# a segment's control words and header are written only in engine/shm/ (docs/DESIGN.md, "Who
# may write what"; issue 72.1): a word stored (``mq[...] = ...``, ``+=``...), or a header struct
# packed into a segment
CONTROL_WORD_WRITE = re.compile(r"_?mq\[[^]]+\] *(=|\+=|-=|\|=|&=)[^=]"
                                r"|\bL\.(STATIC|OPTS|HOT|WORD|PART_STATIC|STREAM_STATIC|GROUP_HEAD|MEMBER|PROC|TXN)"
                                r"\.pack_into\(")


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules() -> dict[str, Path]:
    """{module name: its file} of every module of the shmq package (a C extension: its
    source; it imports no Python module of shmq)."""
    out = {}
    for path in [*ROOT.rglob("*.py"), *ROOT.rglob("_*.c")]:
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(module: str, source: str, known, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, module imported) of every import in ``source`` (the text of ``module``),
    anywhere in it; ``from P import x`` counts as ``P.x`` where that is a module of
    ``known``, else as ``P``."""
    package = module if is_package else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((node.lineno, sub if sub in known else base))
    return list(dict.fromkeys(out))  # (``from P import a, b``: P once)


def _on_a_floor(module: str) -> bool:
    try:
        floor(module)
    except KeyError:
        return False
    return True


def floor(module: str) -> int:
    """The floor of ``module`` (its longest prefix in FLOORS; the root package: the top);
    KeyError if none names it."""
    if module == ROOT_PACKAGE:
        return len(FLOORS) - 1
    best = None
    for level, prefixes in enumerate(FLOORS):
        for p in prefixes:
            if _under(module, (p,)) and (best is None or len(p) > len(best[1])):
                best = (level, p)
    if best is None:
        raise KeyError(f"{module} is on no floor: add it to FLOORS")
    return best[0]


def broken_rules(module: str, imported: str) -> str | None:
    """Why ``module`` may not import ``imported`` (None: it may)."""
    if not _under(imported, ("shmq",)) or imported == ROOT_PACKAGE:
        return None
    for layer, allowed in MAY_IMPORT.items():
        if _under(module, (layer,)) and not _under(imported, allowed):
            return f"{layer} imports only {', '.join(allowed)}"
    for layer, forbidden in MAY_NOT_IMPORT.items():
        if _under(module, (layer,)) and _under(imported, forbidden):
            return f"{layer} imports nothing of {', '.join(forbidden)}"
    if floor(imported) > floor(module):
        return f"floor {floor(module)} imports nothing of floor {floor(imported)}"
    return None


def test_no_module_imports_across_the_layers():
    modules = _modules()
    broken = []
    for name, path in sorted(modules.items()):
        if path.suffix != ".py":
            continue
        for line, imported in imports_of(name, path.read_text(), modules, path.name == "__init__.py"):
            why = broken_rules(name, imported)
            if why is not None:
                broken.append(f"{path.relative_to(ROOT.parent)}:{line}: {imported} ({why})")
    assert broken == []
    # the tables name real packages and modules (a rename would leave a rule checking nothing),
    # and every module is on a floor
    for name in [*MAY_IMPORT, *MAY_NOT_IMPORT, *(p for prefixes in FLOORS for p in prefixes)]:
        assert name in modules, name
    assert [m for m in modules if m != ROOT_PACKAGE and not _on_a_floor(m)] == []


def test_the_check_sees_function_level_and_relative_imports():
    source = ("from ..errors import ShmqError\n"
              "from ..engine.shm import layout\n"
              "def late():\n"
              "    from ..model.records import Record\n"
              "    import shmq.engine.queues.queue\n")
    known = {"shmq.errors", "shmq.engine", "shmq.engine.shm", "shmq.engine.shm.layout", "shmq.model.records",
             "shmq.engine.queues.queue"}
    found = sorted(imports_of("shmq.protocol.payloads", source, known))
    assert found == [(1, "shmq.errors"), (2, "shmq.engine.shm.layout"), (4, "shmq.model.records"),
                     (5, "shmq.engine.queues.queue")]
    assert [broken_rules("shmq.protocol.payloads", m) for _, m in found] == [
        None, "shmq.protocol imports only shmq.protocol, shmq.model, shmq.errors", None,
        "shmq.protocol imports only shmq.protocol, shmq.model, shmq.errors"]
    assert broken_rules("shmq.client.core", "shmq.engine.queues.rpc") == (
        "shmq.client imports nothing of shmq.engine, shmq.server, shmq.persistence")
    assert broken_rules("shmq.engine.aio", "shmq.engine.queues.rpc") is None
    assert broken_rules("shmq.engine.aio", "shmq.server.waiters") == (
        "shmq.engine imports nothing of shmq.protocol, shmq.client, shmq.server, shmq.persistence")
    assert broken_rules("shmq.model.headers", "shmq.errors") is None
    assert broken_rules("shmq.model.headers", "shmq.engine.shm.layout") == "shmq.model imports only shmq.model, shmq.errors"
    assert broken_rules("shmq.engine.queues.queue", "shmq.model.messages") is None
    assert broken_rules("shmq.engine.queues.queue", "shmq.formats.logfiles") is None
    assert broken_rules("shmq.engine.queues.queue", "shmq.persistence.snapshotter") == (
        "shmq.engine imports nothing of shmq.protocol, shmq.client, shmq.server, shmq.persistence")
    assert broken_rules("shmq.formats.logfiles", "shmq.engine.shm.layout") == (
        "shmq.formats imports only shmq.formats, shmq.errors, shmq.sharing")
    assert broken_rules("shmq.engine.queues.queue", "shmq.protocol.payloads") == (
        "shmq.engine imports nothing of shmq.protocol, shmq.client, shmq.server, shmq.persistence")
    # the floors: down and across, never up (the wings are one floor; the root package is loaded first anyway)
    assert broken_rules("shmq.engine.queues.exchange", "shmq.engine.streams.stream") is None
    assert broken_rules("shmq.engine.shm.segment", "shmq.engine.shm.cpaths") is None
    assert broken_rules("shmq.engine.shm.ring", "shmq.engine.queues.queue") == "floor 3 imports nothing of floor 4"
    assert broken_rules("shmq.engine.queues.queue", "shmq.engine.doze") == "floor 4 imports nothing of floor 5"
    assert broken_rules("shmq.server.tcp", "shmq.transactional") == "floor 7 imports nothing of floor 8"
    assert broken_rules("shmq.server.handlers.session", "shmq") is None
    assert floor("shmq.engine.broker") == 5 and floor("shmq.engine.shm.wal") == 3 and floor("shmq.spark.jar") == 9
    # a package's own relative imports resolve from the package itself
    assert imports_of("shmq.model", "from .checks import MAX_PARTITIONS\n", {"shmq.model.checks"}, True) == [
        (1, "shmq.model.checks")]


def _loaded_after(script: str, *args) -> dict:
    """What ``script`` (run in a fresh interpreter) printed as JSON, with ``loaded``: the
    modules of LOCAL_ONLY in its sys.modules at the end."""
    tail = ("\nimport json as _j, sys as _s\n"
            f"_out['loaded'] = sorted(m for m in _s.modules if any(m == p or m.startswith(p + '.') for p in {LOCAL_ONLY!r}))\n"
            "print(_j.dumps(_out))\n")
    done = subprocess.run([sys.executable, "-c", "_out = {}\n" + script + tail, *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_client_loads_no_shared_memory_code():
    out = _loaded_after("import shmq.client\nimport shmq.client.aio\nimport shmq.protocol\nimport shmq.model.keepalive\n"
                        "_out['exports'] = sorted(n for n in ('Message', 'QueueStats', 'Record', 'RecordMetadata', "
                        "'TopicPartition', 'Keepalive', 'connect') if n in vars(shmq))\n")
    assert out == {"loaded": [], "exports": ["Keepalive", "Message", "QueueStats", "Record", "RecordMetadata",
                                             "TopicPartition", "connect"]}


def test_a_refused_tcp_connect_loads_no_shared_memory_code():
    out = _loaded_after("import shmq\n"
                        "try:\n"
                        "    shmq.connect('tcp://127.0.0.1:1')\n"
                        "except shmq.BrokerUnavailable as e:\n"
                        "    _out['error'] = str(e)\n")
    assert out == {"loaded": [], "error": "cannot connect to 127.0.0.1:1: Connection refused"}


CLIENT = """
import sys, time
import shmq
from shmq.model.messages import Message, QueueStats
from shmq.model.records import Record, RecordMetadata, TopicPartition

with shmq.connect(sys.argv[1]) as b:
    q = b.create_queue("layers")
    q.put(b"one", headers={"k": "v"})
    q.put_many([b"two", b"three"])
    peeked = q.peek(3)
    _out["peeked"] = [(type(m) is Message, m.body.decode(), m.headers) for m in peeked]
    d = q.get(timeout=30)
    with d.process():
        _out["first"] = [d.body.decode(), d.headers]
    ds = q.get_many(2, timeout=30)
    _out["rest"] = [x.body.decode() for x in ds]
    q.ack_many(ds)
    st = q.stats()
    _out["stats"] = [type(st) is QueueStats, st.ready, st.in_flight, st.enqueued_total, st.acked_total]
    s = b.create_stream("layers-s", partitions=2)
    md = s.append(b"r1", key=b"k", headers={"h": 1}, partition=1)
    _out["appended"] = [type(md) is RecordMetadata, md.partition, md.offset]
    recs = s.read(1, 0, timeout=30)
    _out["read"] = [(type(r) is Record, r.stream, r.partition, r.offset, r.key.decode(), r.value.decode(), r.headers)
                    for r in recs]
    c = b.consumer("g", streams=["layers-s"])
    got, deadline = [], time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        got = c.poll(timeout=1)
    _out["polled"] = [(r.value.decode(), r.offset) for r in got]
    c.commit()
    _out["assigned"] = [type(tp) is TopicPartition for tp in c.assignment()]
    c.close()
    b.delete_stream("layers-s")
    b.delete_queue("layers")
"""


def test_a_tcp_client_puts_gets_and_reads_without_shared_memory_code(tcp_server):
    out = _loaded_after(CLIENT, tcp_server.url)
    assert out == {
        "loaded": [],
        "peeked": [[True, "one", {"k": "v"}], [True, "two", {}], [True, "three", {}]],
        "first": ["one", {"k": "v"}],
        "rest": ["two", "three"],
        "stats": [True, 0, 0, 3, 3],
        "appended": [True, 1, 0],
        "read": [[True, "layers-s", 1, 0, "k", "r1", {"h": 1}]],
        "polled": [["r1", 0]],
        "assigned": [True, True],
    }


def test_the_moved_names_are_one_object_in_every_old_home():
    from shmq.engine.queues import delivery, exchange, produce, rpc
    from shmq.engine.shm import layout, waits
    from shmq.engine.streams import multiconsumer, stream
    from shmq.model import checks, composite, headers, messages, processing, records
    from shmq.model import keepalive as kept
    from shmq.protocol import payloads, requests

    pairs = [
        (shmq.Message, messages.Message), (delivery.Message, messages.Message),
        (shmq.QueueStats, messages.QueueStats), (delivery.QueueStats, messages.QueueStats),
        (delivery.Processing, processing.Processing), (delivery.raw_body, messages.raw_body),
        (shmq.Record, records.Record), (stream.Record, records.Record), (payloads.Record, records.Record),
        (shmq.RecordMetadata, records.RecordMetadata), (stream.RecordMetadata, records.RecordMetadata),
        (shmq.TopicPartition, records.TopicPartition), (multiconsumer.TopicPartition, records.TopicPartition),
        (multiconsumer.Composite, composite.Composite), (stream.check_txn, checks.check_txn),
        (shmq.Keepalive, kept.Keepalive), (rpc.reply_headers, headers.reply_headers),
        (exchange.check_routing_key, checks.check_routing_key), (produce.as_body, messages.as_body),
        (waits.seconds_ns, checks.seconds_ns),
    ]
    assert [a is b for a, b in pairs] == [True] * len(pairs)
    assert (layout.MAX_PARTITIONS, requests.MAX_PARTITIONS, exchange.MAX_KEY_CHARS, rpc.CORRELATION_ID) == (
        256, 256, 255, "x-correlation-id")
    assert shmq.Queue.__module__ == "shmq.engine.queues.queue" and shmq.Broker.__module__ == "shmq.engine.broker"


# what the engine may import from the rest of shmq: the layers below it (values and checks, the errors, a shared
# namespace's group, the serializers of a handle with one) and persistence's interface; nothing above it
ENGINE_MAY_REACH = ("shmq.model", "shmq.errors", "shmq.sharing", "shmq.serializers", "shmq.formats")


def _import_graph(modules) -> dict[str, dict[str, int]]:
    """{module: {module of shmq it imports: the line}} for every module of shmq."""
    graph = {}
    for name, path in modules.items():
        edges = graph[name] = {}
        if path.suffix != ".py":  # (a C extension imports no module of shmq)
            continue
        for line, imported in imports_of(name, path.read_text(), modules, path.name == "__init__.py"):
            if imported in modules and imported != name:
                edges.setdefault(imported, line)
    return graph


def _a_circle(graph, starts) -> list[str] | None:
    """One circle of imports reached from ``starts``, as [a, b, ..., a]; None if there is none."""
    state = {}  # module -> 1 while on the walk's path, 2 once done
    for start in sorted(starts):
        if start in state:
            continue
        path, todo = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(graph[nxt])))
    return None


def test_the_engines_import_plan_has_no_circle_and_nothing_from_above():
    modules = _modules()
    graph = _import_graph(modules)
    engine = [m for m in modules if _under(m, ("shmq.engine",))]
    circle = _a_circle(graph, engine)
    assert circle is None, "a circle of imports: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:])) + f" -> {circle[-1]}"
    upward = sorted(f"{modules[m].relative_to(ROOT.parent)}:{line}: {imported}" for m in engine
                    for imported, line in graph[m].items()
                    if not _under(imported, ("shmq.engine", *ENGINE_MAY_REACH)))
    assert upward == []
    assert all(name in modules for name in ENGINE_MAY_REACH)


def test_the_circle_check_finds_a_function_level_circle():
    graph = {"a": {"b": 1}, "b": {"c": 4}, "c": {"a": 9, "d": 2}, "d": {}}
    assert _a_circle(graph, ["d", "a"]) == ["a", "b", "c", "a"]
    assert _a_circle({"a": {"b": 1}, "b": {}, "c": {"b": 3}}, ["a", "c"]) is None
    source = "import os\ndef late():\n    from .queue import Queue\n"
    assert imports_of("shmq.engine.queues.lanes", source, {"shmq.engine.queues.queue"}) == [
        (1, "os"), (3, "shmq.engine.queues.queue")]


SWITCHED = """
import array, ctypes, sys
import shmq
from shmq.engine.shm import cpaths
from shmq.engine.queues.delivery import CDelivery, PythonDelivery
from shmq.engine.streams.partitioner import murmur2_python

def takes(q):
    # every take path: get, get_many, get(ack=False), get(copy=False), the consume loop's step
    q.put_many([b"a", b"b", b"c", b"d", b"e", b"f"])
    got = [q.get(timeout=5), *q.get_many(2, timeout=5), q.get(timeout=5, copy=False)]
    q.ack_many(got)
    auto = q.get(timeout=5, ack=False)
    with q.messages(timeout=0) as loop:
        stepped = [d for d in loop]
    with q.reserve(3) as buf:
        loan = type(buf.obj).__name__
        buf[:] = b"xyz"
    last = q.get(timeout=5)
    last.ack()
    return [q.paths.kind, sorted({type(d).__name__ for d in got + stepped + [auto, last]}),
            all(isinstance(d, shmq.Delivery) for d in got + stepped + [auto, last]),
            any(isinstance(d, cpaths.C.DeliveryBase) for d in got + stepped + [auto, last]), loan, len(stepped)]

def stream(s):
    s.append_many([b"v1", b"v2"], keys=[b"k1", b"k2"], partition=0)
    p = s._part(0)
    cols = p.read_columns(0, 10)
    return [s.paths.kind, p.paths is s.paths, s._part(1).paths is s.paths, cols is None or cols[0],
            s.paths.murmur2 is murmur2_python, s.paths.key_partitions is None]

b = shmq.connect(namespace=sys.argv[1])
q_c = b.create_queue("q")
laned_c = b.create_queue("laned", lanes=2)
s_c = b.create_stream("s", partitions=2)
cpaths.set_enabled(False)
q_py, laned_py = b.queue("q"), b.queue("laned")
ser_py = b.queue("q", serializer="json")
s_py = b.stream("s")
_out["after"] = {"q": takes(q_py), "laned": [laned_py.paths.kind, {l.paths.kind for l in laned_py._lanes} == {"python"}],
                 "serialized": ser_py.paths.kind, "stream": stream(s_py)}
_out["before"] = {"q": takes(q_c), "laned": [laned_c.paths.kind, {l.paths.kind for l in laned_c._lanes} == {"c"}],
                  "stream": stream(s_c)}
cpaths.set_enabled(True)
_out["again"] = b.queue("q").paths.kind
for h in (q_c, laned_c, s_c, q_py, laned_py, ser_py, s_py):
    h.close()
b.delete_queue("q")
b.delete_queue("laned")
b.delete_stream("s")
b.close()
"""


def test_set_enabled_changes_only_the_handles_attached_afterwards(namespace):
    from shmq.engine.shm import cpaths

    if not cpaths.FAST:
        pytest.skip("the C hot paths are off (not built, or SHMQ_PURE_PYTHON is set)")
    out = _loaded_after(SWITCHED, namespace)
    assert out["after"] == {
        "q": ["python", ["PythonDelivery"], True, False, "c_char_Array_3", 1],
        "laned": ["python", True],
        "serialized": "python",
        "stream": ["python", True, True, True, True, True],
    }
    assert out["before"] == {
        "q": ["c", ["CDelivery"], True, True, "Loan", 1],
        "laned": ["c", True],
        "stream": ["c", True, True, 4, False, False],
    }
    assert out["again"] == "c"


def control_word_writes(source: str) -> int:
    """How many lines of ``source`` write a segment's control word (``CONTROL_WORD_WRITE``)."""
    return sum(bool(CONTROL_WORD_WRITE.search(line)) for line in source.splitlines())


def test_only_engine_shm_writes_a_control_word():
    """Outside engine/shm/ no module writes a segment's control word or header."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).as_posix()
        if not rel.startswith("shmq/engine/shm/") and control_word_writes(path.read_text()):
            found[rel] = control_word_writes(path.read_text())
    assert not found, f"control words written outside engine/shm/ ({found}): write them through engine/shm/"


def test_the_count_of_control_word_writes_sees_each_form():
    src = ("mq[L.I_READY] += 1\nq._mq[w + 2] = 0\nmq[x] |= 4\nmq[x] &= ~4\nmq[x] -= n\n"
           "L.WORD.pack_into(mm, L.TIMENS_OFF, 0)\nL.GROUP_HEAD.pack_into(mm, off, 1)\n"
           "if mq[L.I_READY] == 0:\nn = mq[L.I_TAIL]\nx = {mq[0]: 1}\nL.REC.pack_into(mm, a)\nL.WORD.unpack_from(mm)\n")
    assert control_word_writes(src) == 7
