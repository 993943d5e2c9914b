"""``from shmq import mp`` in place of ``import multiprocessing as mp``: every name is
there, multiprocessing's own but the queues, in every context; a program changed by
that one line runs the same and leaves nothing behind."""

import concurrent.futures
import json
import multiprocessing
import multiprocessing.queues
import os
import subprocess
import sys

import pytest

from shmq import mp
from shmq.engine.shm.segment import SHM_DIR, namespace_entries
from shmq.mp import contexts

OURS = {"Queue", "SimpleQueue", "JoinableQueue", "get_context"}
METHODS = ["fork", "spawn", "forkserver"]
QUEUES = {"Queue": mp.Queue, "SimpleQueue": mp.SimpleQueue, "JoinableQueue": mp.JoinableQueue}


@pytest.fixture
def start_method():
    """``set(method)``: multiprocessing's start method for this test, restored after."""
    old = multiprocessing.get_start_method(allow_none=True)
    yield lambda method: multiprocessing.set_start_method(method, force=True)
    multiprocessing.set_start_method(old, force=True)


def _square(x):
    return x * x


# ---------------------------------------------------------------- the names
def test_every_name_of_multiprocessing_is_there_and_is_multiprocessing_s_but_the_queues():
    assert set(multiprocessing.__all__) <= set(mp.__all__)
    for name in multiprocessing.__all__:
        assert hasattr(mp, name), name
        if name not in OURS:
            assert getattr(mp, name) is getattr(multiprocessing, name), name
    assert mp.Queue is not multiprocessing.Queue and mp.get_context is contexts.get_context
    star = {}
    exec("from shmq.mp import *", star)
    assert set(multiprocessing.__all__) <= set(star)


def test_the_other_attributes_and_the_submodules_are_multiprocessing_s():
    assert mp.SUBDEBUG == multiprocessing.SUBDEBUG
    assert mp.pool.ThreadPool is multiprocessing.pool.ThreadPool
    assert mp.queues is multiprocessing.queues  # not shmq's queue module
    assert mp.dummy is sys.modules["multiprocessing.dummy"]  # loaded on first use
    assert {"Process", "Queue", "pool", "shared_memory", "SUBWARNING", "Lease"} <= set(dir(mp))
    with pytest.raises(AttributeError, match="module 'shmq.mp' has no attribute 'nope'"):
        mp.nope  # noqa: B018
    with pytest.raises(AttributeError):
        mp.__wrapped__  # noqa: B018  (dunders are never looked up in multiprocessing)


# ---------------------------------------------------------------- the contexts
@pytest.mark.parametrize("method", METHODS)
def test_each_context_s_queues_are_shmq_s_and_the_rest_multiprocessing_s(method):
    ctx = mp.get_context(method)
    std = multiprocessing.get_context(method)
    assert isinstance(ctx, type(std)) and ctx.get_start_method() == method
    assert ctx.get_context() is ctx and ctx.get_context("spawn") is mp.get_context("spawn")
    for kind, cls in QUEUES.items():
        q = getattr(ctx, kind)()
        assert type(q) is cls
        q.close()
    q = ctx.Queue(3, max_bytes=2**20)
    assert q._maxsize == 3 and q._q.max_bytes == 2**20
    assert ctx.Process is std.Process and ctx.reducer is std.reducer
    ev = ctx.Event()
    assert type(ev) is type(std.Event()) and not ev.is_set()


def test_get_context_follows_multiprocessing_s_start_method(start_method):
    start_method("spawn")
    assert mp.get_context() is mp.get_context("spawn") and mp.get_start_method() == "spawn"
    mp.set_start_method("fork", force=True)  # multiprocessing's own: one start method for both
    assert multiprocessing.get_start_method() == "fork" and mp.get_context() is mp.get_context("fork")
    with pytest.raises(ValueError, match="cannot find context for 'nope'"):
        mp.get_context("nope")


def test_the_stdlib_s_own_callers_get_the_stdlib_s_queues():
    ctx = mp.get_context("fork")
    assert type(ctx.SimpleQueue()) is mp.SimpleQueue  # a call from here
    with ctx.Pool(2) as pool:  # the Pool reads its task and result queues' pipes
        assert type(pool._inqueue) is multiprocessing.queues.SimpleQueue
        assert pool.map(_square, range(10)) == [x * x for x in range(10)]
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:  # so does this one
        assert list(ex.map(_square, range(10), timeout=60)) == [x * x for x in range(10)]


# ---------------------------------------------------------------- a program changed by one line
PROGRAM = '''
import concurrent.futures, json, os, sys
import multiprocessing as mp

def worker(q_in, q_out):
    for x in iter(q_in.get, None):
        q_out.put(x * x)

def task(jq, done):
    while True:
        x = jq.get()
        if x is None:
            jq.task_done()
            return
        with done.get_lock():
            done.value += x
        jq.task_done()

def init(q):
    global pool_queue
    pool_queue = q

def pool_square(x):
    pool_queue.put(x)
    return x * x

def record(d, log, ev, lock, arr):
    with lock:
        d["child"] = os.getpid() != d["parent"]
        log.append("child")
        arr[0] = 42.0
    ev.set()

if __name__ == "__main__":
    mp.set_start_method(sys.argv[1])
    out, made = {}, []

    # Process + Queue + join
    q_in, q_out = mp.Queue(), mp.Queue(maxsize=100)
    ps = [mp.Process(target=worker, args=(q_in, q_out)) for _ in range(2)]
    for p in ps:
        p.start()
    for i in range(200):
        q_in.put(i)
    for _ in ps:
        q_in.put(None)
    out["squares"] = sum(q_out.get(timeout=60) for _ in range(200))
    for p in ps:
        p.join()
    out["exitcodes"] = [p.exitcode for p in ps]

    # JoinableQueue, Value
    jq, done = mp.JoinableQueue(), mp.Value("q", 0)
    ps = [mp.get_context().Process(target=task, args=(jq, done)) for _ in range(2)]
    for p in ps:
        p.start()
    for i in range(100):
        jq.put(i)
    for _ in ps:
        jq.put(None)
    jq.join()
    for p in ps:
        p.join()
    out["done"] = done.value

    # Pool.map, a queue in the initializer's arguments
    pq = mp.SimpleQueue()
    with mp.Pool(2, initializer=init, initargs=(pq,)) as pool:
        out["map"] = pool.map(pool_square, range(20))
    out["pool_queue"] = sorted(pq.get() for _ in range(20))

    # Manager, Event, Lock, Array
    with mp.Manager() as m:
        d, log = m.dict(parent=os.getpid()), m.list()
        ev, lock, arr = mp.Event(), mp.Lock(), mp.Array("d", 3)
        p = mp.Process(target=record, args=(d, log, ev, lock, arr))
        p.start()
        out["event"] = ev.wait(60)
        p.join()
        out["manager"] = [d["child"], list(log), arr[0]]

    # a context's queue, and an executor on that context
    ctx = mp.get_context(sys.argv[1])
    cq = ctx.Queue()
    cq.put("ctx")
    out["ctx_queue"] = cq.get(timeout=60)
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as ex:
        out["executor"] = list(ex.map(abs, [-1, -2, -3]))

    out["cpus"] = mp.cpu_count() == os.cpu_count()
    out["queues"] = sorted({type(q).__module__ for q in (q_in, q_out, jq, pq, cq)})
    out["namespaces"] = [q._ns for q in (q_in, q_out, jq, pq, cq) if hasattr(q, "_ns")]
    print(json.dumps(out))
'''


def _run(tmp_path, source, method):
    path = tmp_path / "program.py"
    path.write_text(source)
    proc = subprocess.Popen([sys.executable, str(path), method], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, stderr
    return json.loads(stdout), proc.pid


def _left_by(pid):
    """What namespaces made by process ``pid`` (``mp<pid>x...``) left in /dev/shm."""
    prefixes = (f"shmq.mp{pid}x", f"sem.shmq.mp{pid}x")
    return [e for e in os.listdir(SHM_DIR) if e.startswith(prefixes)]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_a_program_switched_by_one_line_runs_the_same_and_leaves_nothing(tmp_path, method):
    stdlib, _ = _run(tmp_path, PROGRAM, method)
    swapped = PROGRAM.replace("import multiprocessing as mp\n", "from shmq import mp\n")
    shmq, pid = _run(tmp_path, swapped, method)
    assert stdlib["queues"] == ["multiprocessing.queues"] and shmq["queues"] == ["shmq.mp.queue"]
    namespaces = shmq.pop("namespaces")
    assert len(namespaces) == 5 and stdlib.pop("namespaces") == []
    del stdlib["queues"], shmq["queues"]
    assert shmq == stdlib == {
        "squares": sum(x * x for x in range(200)), "exitcodes": [0, 0], "done": sum(range(100)),
        "map": [x * x for x in range(20)], "pool_queue": list(range(20)), "event": True,
        "manager": [True, ["child"], 42.0], "ctx_queue": "ctx", "executor": [1, 2, 3], "cpus": True}
    assert [e for ns in namespaces for e in namespace_entries(ns)] == [] and _left_by(pid) == []

