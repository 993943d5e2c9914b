"""Loaders feeding a trainer numpy arrays: ``python -m bench.arrays``.

P loader processes (``--pairs``: 1 -> 1 and 4 -> 1) each send ``--count`` / P float32 arrays
of ``--sizes`` bytes (1 and 4 MiB; one array per loader, made before the run, sent again and
again) to one trainer process, which reads every element of each (``x.sum()``: a trainer
uses its batch) and lets it go. Per system:

- ``shmq``: ``q.put_array(a)`` / ``d.array(copy=True)``, ack: the copying path;
- ``shmq-zc``: ``q.reserve(n)`` filled from the array / ``get(copy=False)`` and an array made
  on the body by hand (``np.frombuffer``), ack: zero-copy by hand;
- ``shmq-arrays``: ``q.put_array(a)`` / ``get(copy=False)`` and ``d.array()``, the array where
  it lies, ack once it is let go: the arrays API;
- ``mpqueue``: ``multiprocessing.Queue``, the array pickled;
- ``shared-memory``: ``multiprocessing.shared_memory`` by hand, the baseline of doing it
  yourself: 2 x P slots of one block, their indices passed through two
  ``multiprocessing.Queue``s (free and filled), the loader copying its array into a free
  slot, the trainer reading it there;
- ``iceoryx2``: a publisher loans a sample and copies the array into it, the subscriber
  reads it where it lies (an array on the sample's memory) and lets it go; 1 -> 1 only
  (publish-subscribe hands every subscriber every sample, and one publisher per service here).

Each figure is the median of ``--runs`` runs (arrays/s from the trainer's first array to its
last, after a warm-up of the same case), with min .. max, and its ratio to ``mpqueue``'s and to
``iceoryx2``'s in the same run. Loaders and trainer are pinned to distinct CPUs where there are
enough (on 2 CPUs, the 4 loaders share one).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time

from bench import harness, provenance
from bench.adapters import run_namespace
from bench.machine import machine_info
from bench.plan import parse_size

PROG = "python -m bench.arrays"
SYSTEMS = ("shmq", "shmq-zc", "shmq-arrays", "mpqueue", "shared-memory", "iceoryx2")
DEPTH = 16  # arrays in flight at most, in every system (queue bytes, queue size, slots, subscriber buffer)
WARMUP = 20
TIMEOUT_S = 120


def _pin(role_index):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        os.sched_setaffinity(0, {cpus[0]} if role_index == 0 else {cpus[1 + (role_index - 1) % (len(cpus) - 1)]})


def _array(size, seed):
    import numpy as np

    return np.random.default_rng(seed).random(size // 4, dtype=np.float32)


def _use(x):
    """What the trainer does with a batch: reads every element."""
    return float(x.sum())


# ---------------------------------------------------------------- shmq
def _shmq_loader(spec, system, size, n, seed, ready):
    import shmq

    _pin(1 + seed)
    a = _array(size, seed)
    flat = memoryview(a).cast("B")
    with shmq.connect(namespace=spec) as b:
        q = b.queue("arrays")
        ready.wait()
        for _ in range(n):
            if system == "shmq-zc":
                with q.reserve(size) as buf:
                    buf[:] = flat
            else:
                q.put_array(a)
        q.close()


def _shmq_trainer(spec, system, size, total, out):
    import numpy as np

    import shmq

    _pin(0)
    with shmq.connect(namespace=spec) as b:
        q = b.queue("arrays")
        first = None
        for i in range(total):
            if system == "shmq-zc":
                d = q.get(copy=False)
                x = np.frombuffer(d.body, np.float32)
                _use(x)
                del x
            elif system == "shmq":
                d = q.get()
                _use(d.array(copy=True))
            else:
                d = q.get(copy=False)  # (the body is not copied out at all: the array is made where it lies)
                x = d.array()
                _use(x)
                del x
            d.ack()
            if first is None:
                first = time.perf_counter()
        out.put(time.perf_counter() - first)
        q.close()


class _Shmq:
    def __init__(self, system, size, pairs):
        import shmq

        self.ns = run_namespace(f"arr{system[-2:]}")
        self.broker = shmq.connect(namespace=self.ns)
        self.broker.create_queue("arrays", max_bytes=DEPTH * (size + 4096), max_message_bytes=size)
        self.spec = self.ns

    loader, trainer = staticmethod(_shmq_loader), staticmethod(_shmq_trainer)

    def close(self):
        import shmq

        self.broker.close()
        shmq.destroy_namespace(self.ns)


# ---------------------------------------------------------------- multiprocessing.Queue
def _mpq_loader(q, system, size, n, seed, ready):
    _pin(1 + seed)
    a = _array(size, seed)
    ready.wait()
    for _ in range(n):
        q.put(a)


def _mpq_trainer(q, system, size, total, out):
    _pin(0)
    first = None
    for _ in range(total):
        _use(q.get())
        if first is None:
            first = time.perf_counter()
    out.put(time.perf_counter() - first)


class _MpQueue:
    def __init__(self, system, size, pairs, ctx):
        self.spec = ctx.Queue(maxsize=DEPTH)

    loader, trainer = staticmethod(_mpq_loader), staticmethod(_mpq_trainer)

    def close(self):
        self.spec.close()


# ---------------------------------------------------------------- multiprocessing.shared_memory by hand
def _shm_loader(spec, system, size, n, seed, ready):
    import numpy as np
    from multiprocessing import shared_memory

    name, free, filled = spec
    _pin(1 + seed)
    a = _array(size, seed)
    block = shared_memory.SharedMemory(name)
    ready.wait()
    for _ in range(n):
        slot = free.get()
        np.frombuffer(block.buf, np.float32, a.size, slot * size)[:] = a
        filled.put(slot)
    block.close()


def _shm_trainer(spec, system, size, total, out):
    import numpy as np
    from multiprocessing import shared_memory

    name, free, filled = spec
    _pin(0)
    block = shared_memory.SharedMemory(name)
    first = None
    for _ in range(total):
        slot = filled.get()
        x = np.frombuffer(block.buf, np.float32, size // 4, slot * size)
        _use(x)
        del x
        free.put(slot)
        if first is None:
            first = time.perf_counter()
    out.put(time.perf_counter() - first)
    block.close()


class _SharedMemory:
    def __init__(self, system, size, pairs, ctx):
        from multiprocessing import shared_memory

        slots = DEPTH
        self.block = shared_memory.SharedMemory(create=True, size=slots * size)
        free, filled = ctx.Queue(), ctx.Queue()
        for s in range(slots):
            free.put(s)
        self.spec = (self.block.name, free, filled)

    loader, trainer = staticmethod(_shm_loader), staticmethod(_shm_trainer)

    def close(self):
        self.block.close()
        self.block.unlink()


# ---------------------------------------------------------------- iceoryx2
def _iox_service(spec, create=False):
    """(node, publish-subscribe service, event service) of the case, made or opened."""
    import ctypes

    import iceoryx2 as iox2

    from bench.adapters.iceoryx2_pubsub import node

    prefix, root, name, size = spec
    n = node(prefix, root)
    pubsub = (n.service_builder(iox2.ServiceName.new(name)).publish_subscribe(iox2.Slice[ctypes.c_uint8])
              .enable_safe_overflow(False).subscriber_max_buffer_size(DEPTH).max_publishers(1).max_subscribers(1))
    event = n.service_builder(iox2.ServiceName.new(name)).event()
    return n, (pubsub.create() if create else pubsub.open()), (event.create() if create else event.open())


def _iox_loader(spec, system, size, n, seed, ready):
    import ctypes

    import iceoryx2 as iox2

    _pin(1 + seed)
    a = _array(size, seed)
    _node, service, event = _iox_service(spec)
    pub = (service.publisher_builder().initial_max_slice_len(size)
           .backpressure_strategy(iox2.BackpressureStrategy.RetryUntilDelivered).create())
    note = event.notifier_builder().create()
    addr = a.ctypes.data
    ready.wait()
    for _ in range(n):
        while True:
            sample = pub.loan_slice_uninit(size)
            ctypes.memmove(sample.payload_ptr, addr, size)
            if sample.assume_init().send():
                break
            time.sleep(0.001)  # (no subscriber yet)
        note.notify()
    note.delete()
    pub.delete()


def _iox_trainer(spec, system, size, total, out):
    import ctypes

    import numpy as np

    _pin(0)
    _node, service, event = _iox_service(spec)
    sub = service.subscriber_builder().buffer_size(DEPTH).create()
    listener = event.listener_builder().create()
    out.put("ready")
    first = None
    got = 0
    while got < total:
        sample = sub.receive()
        if sample is None:
            listener.blocking_wait()
            continue
        x = np.frombuffer((ctypes.c_char * size).from_address(sample.payload_ptr), np.float32)
        _use(x)
        del x
        sample.delete()
        got += 1
        if first is None:
            first = time.perf_counter()
    out.put(time.perf_counter() - first)
    listener.delete()
    sub.delete()


class _Iceoryx2:
    """A publish-subscribe service (and its event service) of the case, held by the parent;
    iceoryx2's files under a directory of the run's own."""

    def __init__(self, system, size, pairs, ctx):
        import tempfile

        self.root = tempfile.mkdtemp(prefix="bench-arrays-iox2-")
        self.prefix = f"iox2arrays{os.getpid()}_"
        self.spec = (self.prefix, self.root, f"arrays/{size}", size)
        self.held = _iox_service(self.spec, create=True)

    loader, trainer = staticmethod(_iox_loader), staticmethod(_iox_trainer)

    def close(self):
        import shutil

        from bench.adapters import SHM_DIR

        self.held = None
        shutil.rmtree(self.root, ignore_errors=True)
        for name in os.listdir(SHM_DIR):
            if name.startswith(self.prefix):
                os.unlink(os.path.join(SHM_DIR, name))


def _setup(system, size, pairs, ctx):
    if system.startswith("shmq"):
        return _Shmq(system, size, pairs)
    return {"mpqueue": _MpQueue, "shared-memory": _SharedMemory, "iceoryx2": _Iceoryx2}[system](system, size, pairs,
                                                                                               ctx)


def available(system) -> str | None:
    """Why ``system`` cannot run here, or None."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        return "numpy is not installed (pip install 'shmq[numpy]')"
    if system == "iceoryx2":
        try:
            import iceoryx2  # noqa: F401
        except ImportError:
            return "iceoryx2 is not installed (the bench extra)"
    return None


def one_run(ctx, system, size, pairs, count):
    """arrays/s of one run (after a warm-up of the same processes)."""
    setup = _setup(system, size, pairs, ctx)
    procs = []
    try:
        per = count // pairs
        total = per * pairs
        out, ready = ctx.Queue(), ctx.Event()
        trainer = ctx.Process(target=setup.trainer, args=(setup.spec, system, size, total + WARMUP * pairs, out))
        trainer.start()
        procs.append(trainer)
        if system == "iceoryx2":
            out.get(timeout=TIMEOUT_S)  # (the subscriber is there before the first sample)
        for i in range(pairs):
            p = ctx.Process(target=setup.loader, args=(setup.spec, system, size, per + WARMUP, i, ready))
            p.start()
            procs.append(p)
        ready.set()
        seconds = out.get(timeout=TIMEOUT_S)
        for p in procs:
            p.join(TIMEOUT_S)
        return (total + WARMUP * pairs - 1) / seconds
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        setup.close()


def _numpy_version():
    try:
        import numpy
    except ImportError:
        return None
    return numpy.__version__


def _size_text(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


@harness.leaves_no_processes
def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma list from {','.join(SYSTEMS)}")
    p.add_argument("--sizes", default="1048576,4194304",
                   help="array bytes, a comma list (1m, 4MiB and 65536 alike; default 1 and 4 MiB)")
    p.add_argument("--pairs", default="1,4", help="loaders per trainer, a comma list (default 1,4)")
    p.add_argument("--count", type=int, default=2000, help="arrays per run (default 2000)")
    p.add_argument("--runs", type=int, default=3, help="runs per case (default 3)")
    p.add_argument("--json", default=None, help="write the runs here")
    args = p.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems: {', '.join(sorted(unknown))}")
    try:
        sizes = [parse_size(x) for x in args.sizes.split(",") if x.strip()]
        pairs_list = [int(x) for x in args.pairs.split(",") if x.strip()]
    except ValueError:
        p.error(f"--sizes takes byte counts such as 1048576, 1m or 4MiB, --pairs whole numbers: not "
                f"{args.sizes!r}, {args.pairs!r}")
    if not sizes or not pairs_list or min(sizes) < 4 or min(pairs_list) < 1:
        p.error("--sizes wants arrays of 4 bytes or more, --pairs 1 loader or more")
    skipped = {s: why for s in systems if (why := available(s))}
    ctx = harness.context()
    load = os.getloadavg()[0]
    raw = []
    for run in range(args.runs):  # the systems alternate, so a change in the machine's load hits them alike
        for size in sizes:
            for pairs in pairs_list:
                for system in systems:
                    if system in skipped or (system == "iceoryx2" and pairs > 1):
                        continue
                    count = max(pairs * 10, args.count * (1 << 20) // size)
                    rate = one_run(ctx, system, size, pairs, count)
                    raw.append({"system": system, "size": size, "pairs": pairs, "run": run, "arrays_per_s": rate})
                    print(f"run {run + 1} {system} {_size_text(size)} {pairs}->1: {rate:,.0f} arrays/s",
                          file=sys.stderr)
    rows = summarize(raw)
    print_table(rows, skipped)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance.run_header("arrays", shlex.join([*PROG.split(), *argv])),
                       "machine": dict(machine_info(), numpy=_numpy_version(), load=(load, os.getloadavg()[0])),
                       "count": args.count,
                       "runs": args.runs, "skipped": skipped, "rows": rows, "raw": raw}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


def summarize(raw):
    """Per (size, pairs, system): the median rate, min, max, GB/s, and its ratios to mpqueue's
    and iceoryx2's medians of the same case."""
    rows = []
    cases = sorted({(r["size"], r["pairs"]) for r in raw})
    for size, pairs in cases:
        mine = [r for r in raw if (r["size"], r["pairs"]) == (size, pairs)]
        medians = {}
        for system in SYSTEMS:
            rates = [r["arrays_per_s"] for r in mine if r["system"] == system]
            if rates:
                medians[system] = (statistics.median(rates), min(rates), max(rates))
        for system, (med, lo, hi) in medians.items():
            rows.append({"size": size, "pairs": pairs, "system": system, "arrays_per_s": med, "min": lo, "max": hi,
                         "gb_per_s": med * size / 1e9,
                         "vs_mpqueue": med / medians["mpqueue"][0] if "mpqueue" in medians else None,
                         "vs_iceoryx2": med / medians["iceoryx2"][0] if "iceoryx2" in medians else None})
    return rows


def print_table(rows, skipped):
    print(f"{'size':>6} {'P->1':>5} {'system':14} {'arrays/s':>10} {'(min .. max)':>22} {'GB/s':>6} "
          f"{'vs mpqueue':>10} {'vs iceoryx2':>11}")
    for r in rows:
        vm = f"{r['vs_mpqueue']:.2f}x" if r["vs_mpqueue"] else "-"
        vi = f"{r['vs_iceoryx2']:.2f}x" if r["vs_iceoryx2"] else "-"
        print(f"{_size_text(r['size']):>6} {r['pairs']:>3}->1 {r['system']:14} {r['arrays_per_s']:>10,.0f} "
              f"({r['min']:>8,.0f} .. {r['max']:>8,.0f}) {r['gb_per_s']:>6.2f} {vm:>10} {vi:>11}")
    for system, why in skipped.items():
        print(f"skipped {system}: {why}")


if __name__ == "__main__":
    sys.exit(main())
