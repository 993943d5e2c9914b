"""The harness: runs any Job against any Adapter, each role in a process of its own
(``context()``'s: forked from a server that has imported shmq and the bench once).

Strategy: a case's processes open their Ends, warm up, report "ready", then wait at a
barrier; the parent releases them once per run and collects one reply per role, with
every wait bounded (a crash, a hang or a broken barrier ends the case, never the run).
A child killed for hanging leaves its Python stacks (faulthandler on SIGTERM) for the
report. Failures become a CaseResult's status and detail; nothing here raises for them.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from multiprocessing import connection

from bench import adapters
from bench.plan import START_TIMEOUT

START_METHOD = "forkserver"  # (the runs saved before 2026-11-29 said "spawn": each role a new interpreter)
# what a bench's process server imports once, before any role forks from it
PRELOAD = ("shmq", "shmq.engine.broker", "shmq.client", "bench.harness", "bench.roles", "bench.stream_roles",
           "bench.adapters")


def context():
    """The multiprocessing context every bench starts its roles in: ``forkserver``, whose
    server imports ``PRELOAD`` once. A role is a fork of that server (a few milliseconds),
    not a new interpreter importing shmq again (about 0.3 CPU-seconds each, half the CPU of
    a --quick run), and still starts as spawn's do: no threads, none of the parent's state,
    its target named by module (what ``spawn`` takes, this takes). A role times itself
    from its barrier, so the start is in no figure."""
    ctx = multiprocessing.get_context(START_METHOD)
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def server_pid():
    """The pid of the process server ``context()`` starts, while one runs (else None)."""
    return getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)


def stop_processes():
    """Stop (and reap) the process server ``context()`` started, if one runs: a bench run
    in a caller's process (a test's) leaves no process behind. (CPython has no public way;
    its ``_stop`` is the one its own tests use.)"""
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def leaves_no_processes(main):
    """A bench's ``main``, the process server it started stopped when it returns or raises
    (one its caller runs already, the test suite's, is the caller's and is left running)."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        running = server_pid() is not None
        try:
            return main(*args, **kwargs)
        finally:
            if not running:
                stop_processes()
    return run


BARRIER_TIMEOUT = 10.0
REAP_TIMEOUT = 10.0


class CaseFailed(Exception):
    """A case ended early; status is "timeout" or "error"."""

    def __init__(self, status, detail):
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class CaseResult:
    """Raw outcome of one case: per-run results from the measuring process (a "case" in the JSON)."""

    system: str
    kind: str
    size: int
    mode: str
    n: int
    pairs: int = 1
    status: str = "ok"
    detail: str = ""
    runs: list = field(default_factory=list)
    seconds: float = 0.0
    shape: str = "P->P"  # plan.Job.shape


# ---------------------------------------------------------------- the child side


def _trace_on_terminate(path):
    """On SIGTERM, write every thread's Python stack to ``path``, then die as usual."""
    fh = open(path, "w")
    faulthandler.register(signal.SIGTERM, file=fh, all_threads=True, chain=True)
    return fh


def _child(role, job, end, specs, barrier, conn, trace_path, total):
    """Process entry: open, warm up, report ready, then one result per barrier release."""
    trace = _trace_on_terminate(trace_path)  # noqa: F841  (kept open for the handler)
    kind = role.rstrip("0123456789")
    try:
        if job.cpus:
            os.sched_setaffinity(0, {job.cpus[job.roles.index(role)]})
        bodies = importlib.import_module(job.roles_module)  # bench.roles, or a job's own (bench.stream_roles)
        ends = bodies.open_ends(role, job, end, specs)
        try:
            index = int(role[len(kind):] or 0)  # producer3: the fourth producer
            warm = bodies.WARMUPS.get(kind)
            if warm is not None:
                warm(job, ends, total, *((index,) if kind == "producer" else ()))
            conn.send(("ready", None))
            for run in range(job.runs):
                barrier.wait(timeout=job.wait)
                args = (total,) if kind == "consumer" else (index,) if kind == "producer" else ()
                conn.send((f"run{run}", bodies.ROLES[kind](job, ends, *args)))
            barrier.wait(timeout=job.wait)  # nobody closes while the peer may still be reading
        finally:
            for e in ends:
                e.close()
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        conn.close()


# ---------------------------------------------------------------- the parent side


def _take(role, conn, tag):
    """Read one reply from a child; raise CaseFailed on an error or an unexpected tag."""
    try:
        got, payload = conn.recv()
    except (EOFError, OSError):
        raise CaseFailed("error", f"{role} exited without replying") from None
    if got == "error":
        raise CaseFailed("error", f"{role} failed:\n{payload}")
    if got != tag:
        raise CaseFailed("error", f"{role} replied {got!r}, expected {tag!r}")
    return payload


def _collect(tag, conns, procs, timeout):
    """Wait for reply ``tag`` from every child, watching for crashes; bounded by timeout."""
    deadline = time.monotonic() + timeout
    pending = dict(conns)
    replies = {}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise CaseFailed("timeout", f"no {tag!r} from {', '.join(pending)} within {timeout:.0f}s")
        waitables = list(pending.values()) + [procs[r].sentinel for r in pending]
        ready = connection.wait(waitables, timeout=left)
        for role in list(pending):
            conn, proc = pending[role], procs[role]
            if conn in ready or conn.poll():
                replies[role] = _take(role, conn, tag)
                del pending[role]
            elif proc.sentinel in ready:
                raise CaseFailed("error", f"{role} exited with code {proc.exitcode} before {tag!r}")
    return replies


def _release(barrier, conns):
    """Start a run; on a broken barrier report the child error if there is one."""
    try:
        barrier.wait(timeout=BARRIER_TIMEOUT)
    except threading.BrokenBarrierError:
        for role, conn in conns.items():
            if conn.poll():
                try:
                    got, payload = conn.recv()
                except (EOFError, OSError):
                    raise CaseFailed("error", f"{role} exited before the start barrier") from None
                if got == "error":
                    raise CaseFailed("error", f"{role} failed:\n{payload}") from None
        raise CaseFailed("timeout", "children did not reach the start barrier") from None


def _reap(procs, grace):
    """Join every process within ``grace`` seconds; terminate (then kill) the rest."""
    deadline = time.monotonic() + grace
    stuck = []
    for role, proc in procs.items():
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            stuck.append(role)
            proc.terminate()
            proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return stuck


def _is_bootstrap(line):
    """Frames of multiprocessing's own start-up code, common to every child."""
    return "multiprocessing" + os.sep in line or '"<string>"' in line


def _stack_report(role, path, keep=14):
    """The innermost frames a terminated child was in, from its SIGTERM dump."""
    try:
        with open(path) as fh:
            lines = [ln.rstrip() for ln in fh if ln.strip() and not _is_bootstrap(ln)]
    except OSError:
        return f"\n{role} was terminated (no stack dump)"
    if not lines:
        return f"\n{role} was terminated (empty stack dump)"
    return f"\n{role} was terminated; its stacks, innermost first:\n" + "\n".join(lines[:keep])


def _spawn(ctx, job, end, specs, barrier, trace_dir, total):
    """Start every process of a case; return ({role: proc}, {role: reader})."""
    procs, conns = {}, {}
    for role in job.roles:
        reader, writer = ctx.Pipe(duplex=False)
        trace_path = os.path.join(trace_dir, f"{role}.txt")
        proc = ctx.Process(
            target=_child, args=(role, job, end, specs, barrier, writer, trace_path, total),
            name=f"bench-{role}", daemon=True,
        )
        proc.start()
        writer.close()
        procs[role], conns[role] = proc, reader
    return procs, conns


def _merge_consumers(job, replies):
    """One run's result: the slowest consumer's time; the consumers' counts must add up to n.
    Producers that time themselves (streams' appenders) add the slowest one's time. Workers
    (of a producers-only case, or a contention case) count as consumers; those of a case
    that runs for a time (contention) count what they did: the run's count ("n") is their
    sum, at most n."""
    parts = [v for k, v in replies.items() if k.startswith(("consumer", "worker"))]
    got = sum(p.get("got", job.n) for p in parts)
    timed = any("until" in p for p in parts)
    if got > job.n if timed else got != job.n:
        raise CaseFailed("error", f"consumers received {got} messages, expected {job.n}")
    out = {"seconds": max(p["seconds"] for p in parts)}
    if timed:
        out.update(n=got, short=sum(p["until"] == "cap" for p in parts))
    sent = [v["seconds"] for k, v in replies.items() if k.startswith("producer") and "seconds" in v]
    if sent:
        out["append_seconds"] = max(sent)
    return out


def _prepare(job, end, specs, runs, timeout):
    """``job.before_run`` (it fills or empties the case's queue through the system under
    test), bounded by ``timeout``: a queue that holds fewer messages than a run put ends
    the case, not the bench. A thread left waiting ends with the adapter's server."""
    failed = []

    def body():
        try:
            job.before_run(end, specs, runs)
        except BaseException:
            failed.append(traceback.format_exc())

    thread = threading.Thread(target=body, name="bench-before-run", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CaseFailed("timeout", f"setting up run {len(runs) + 1} (filling or emptying the queue) took over "
                                    f"{timeout:.0f}s")
    if failed:
        raise CaseFailed("error", f"setting up run {len(runs) + 1} failed:\n{failed[0]}")


def _drive(job, end, specs, barrier, procs, conns, run_timeout, progress, runs, total):
    """Run the case's runs, appending the measured result of each to ``runs``."""
    _collect("ready", conns, procs, START_TIMEOUT)
    for run in range(job.runs):
        progress(run)
        total.value = 0
        _prepare(job, end, specs, runs, run_timeout)
        _release(barrier, conns)
        replies = _collect(f"run{run}", conns, procs, run_timeout)
        runs.append(replies[job.roles[0]] if job.kind == "rtt" else _merge_consumers(job, replies))
    _release(barrier, conns)


def run_case(job, adapter, ctx, run_timeout, progress):
    """Run one case end to end; never raises for failures inside the case."""
    result = CaseResult(job.system, job.kind, job.size, job.mode, job.n, pairs=job.pairs, shape=job.shape)
    started = time.monotonic()
    specs, procs = [], {}
    end = adapter.End
    if job.kind == "tput" and job.consumers > 1 and adapter.MeshEnd is not None:
        job, end = replace(job, mesh=True), adapter.MeshEnd
    trace_dir = tempfile.TemporaryDirectory(prefix="shmq-bench-trace-")
    try:
        specs = [adapter.make_case(ctx, job) for _ in range(job.channels)]
        barrier, total = ctx.Barrier(len(job.roles) + 1), ctx.Value("q", 0)
        procs, conns = _spawn(ctx, job, end, specs, barrier, trace_dir.name, total)
        _drive(job, end, specs, barrier, procs, conns, run_timeout, progress, result.runs, total)
    except CaseFailed as exc:
        result.status, result.detail = exc.status, exc.detail
        result.detail += f"\n({len(result.runs)} of {job.runs} runs had completed)"
    except Exception:
        result.status, result.detail = "error", traceback.format_exc()
    finally:
        grace = REAP_TIMEOUT if result.status == "ok" else 0.5
        stuck = _reap(procs, grace) if procs else []
        if stuck and result.status == "ok":
            result.status, result.detail = "error", "processes did not exit after the last run"
        for role in stuck:
            result.detail += _stack_report(role, os.path.join(trace_dir.name, f"{role}.txt"))
        trace_dir.cleanup()
        for spec in specs:
            try:
                adapter.drop(spec)
            except Exception:
                result.detail += f"\ncleanup of {spec!r} failed:\n{traceback.format_exc()}"
    result.seconds = time.monotonic() - started
    return result


# ---------------------------------------------------------------- a run of many cases


class Progress:
    """Progress lines on stderr: case index, label, run k/R."""

    def __init__(self, total, stream=sys.stderr):
        self._total = total
        self._index = 0
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.monotonic()

    def case(self, job):
        self._index += 1
        index = self._index

        def on_run(run):
            elapsed = time.monotonic() - self._started
            text = f"[{index}/{self._total}] {job.label}: run {run + 1}/{job.runs} ({elapsed:.0f}s)"
            if self._tty:
                self._stream.write("\r\033[K" + text)
            else:
                self._stream.write(text + "\n")
            self._stream.flush()

        return on_run

    def done(self, result):
        if result.status != "ok":
            line = f"  -> {result.system} {result.kind} {result.size}B {result.mode}: {result.status}"
            self._stream.write(("\n" if self._tty else "") + line + "\n")
        self._stream.flush()

    def finish(self):
        if self._tty:
            self._stream.write("\n")
        self._stream.write(f"done in {time.monotonic() - self._started:.1f}s\n")
        self._stream.flush()


def open_adapters(systems, skipped):
    """{system: Adapter} for the systems that can run here; the others go into ``skipped`` with the reason."""
    opened = {}
    for system in systems:
        reason = adapters.probe(system)
        if reason:
            skipped[system] = reason
            continue
        try:
            opened[system] = adapters.adapter_class(system)()
        except Exception as exc:
            skipped[system] = f"{system} setup failed: {exc!r}"
    return opened


def run_systems(systems, plan_jobs, ctx, run_timeout):
    """A front end's run: open the adapters of ``systems``, run the jobs ``plan_jobs(opened)``
    returns, close the adapters; returns (skipped systems with why, [(result, summary)], notes)."""
    skipped = {}
    opened = open_adapters(systems, skipped)
    progress = None
    try:
        jobs = plan_jobs(opened)
        progress = Progress(len(jobs))
        results = run_jobs(jobs, opened, ctx, run_timeout, progress)
    finally:
        notes = close_adapters(opened)
        if progress is not None:
            progress.finish()
    return skipped, results, notes


def close_adapters(opened):
    """Close every adapter; returns the notes on what they left behind or failed to clean."""
    notes = []
    for system, adapter in opened.items():
        try:
            notes += adapter.close()
        except Exception:
            notes.append(f"cleanup of {system} failed:\n{traceback.format_exc()}")
    return notes


def summarize(result):
    """Median and spread of one case's runs (empty dict unless status is ok)."""
    if result.status != "ok" or not result.runs:
        return {}
    if result.kind == "rtt":
        p50 = [r["p50_us"] for r in result.runs]
        p99 = [r["p99_us"] for r in result.runs]
        p999 = [r.get("p999_us", r["max_us"]) for r in result.runs]
        return {
            "p50_us": statistics.median(p50),
            "p99_us": statistics.median(p99),
            "p999_us": statistics.median(p999),
            "p50_min_us": min(p50),
            "p50_max_us": max(p50),
        }
    rates = [r.get("n", result.n) / r["seconds"] for r in result.runs]
    median = statistics.median(rates)
    out = {
        "msgs_per_s": median,
        "msgs_per_s_min": min(rates),
        "msgs_per_s_max": max(rates),
        "mb_per_s": median * result.size / 1e6,
    }
    appends = [result.n / r["append_seconds"] for r in result.runs if r.get("append_seconds")]
    if appends:
        out["append_per_s"] = statistics.median(appends)
    return out


def run_jobs(jobs, opened, ctx, run_timeout, progress):
    """Run each job on the adapter of its system (skipping what that adapter cannot run);
    returns [(CaseResult, summary)]."""
    results = []
    for job in jobs:
        adapter = opened[job.system]
        on_run = progress.case(job)
        reason = adapter.unsupported(job)
        if reason:
            results.append((CaseResult(job.system, job.kind, job.size, job.mode, job.n, job.pairs, "skipped", reason,
                                       shape=job.shape), {}))
            continue
        result = run_case(job, adapter, ctx, run_timeout, on_run)
        progress.done(result)
        results.append((result, summarize(result)))
    return results
