"""What ``kombu_suite`` and ``celery_suite`` share: a peer's own pytest suite, taken from
its sdist on the package index at the installed version, run against brokers started for
the run, with a deadline per test and each test's outcome read back as it ends.

Strategy: the peer's ``t/`` alone is unpacked into a work directory of its own (no
``kombu/``, ``celery/`` or ``shmq/`` folder beside it: kombu's integration package puts
the parent directory on sys.path), with a ``pytest.ini`` that carries the peer's own
pytest settings and ``peer_deadline.py``, a plugin that bounds each test and writes one
JSON line per test phase. pytest runs in a process group of its own; if it dies or hangs
past the hard limit, the tests it did not reach are run again in a new process, the one
it hung in counted as a timeout.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from importlib.metadata import version

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "shmq-peers")
PLUGIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_deadline.py")
STOP = threading.Event()  # set: the runs stop (their pytest killed, their brokers stopped)
HARD_GRACE = 60.0  # seconds past a test's deadline after which its process is killed (the deadline did not end it)


def read_text(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sdist_tests(project: str, src: str | None, workdir: str) -> str:
    """A directory of ``workdir`` holding ``t/`` of ``project``'s sdist at its installed
    version: from ``src`` if it is a source tree (it has ``t/integration``), else from the
    sdist in ``src`` (default ~/.cache/shmq-peers), downloaded there with pip if missing."""
    ver = version(project)
    if src and os.path.isdir(os.path.join(src, "t", "integration")):
        root = os.path.join(workdir, f"{project}-tests")  # (not "kombu": its integration tests put ".." on sys.path)
        shutil.copytree(os.path.join(src, "t"), os.path.join(root, "t"))
        return root
    cache = src or CACHE
    os.makedirs(cache, exist_ok=True)
    tarball = os.path.join(cache, f"{project}-{ver}.tar.gz")
    if not os.path.exists(tarball):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                        f"{project}=={ver}", "-d", cache], check=True)
    root = os.path.join(workdir, f"{project}-tests")  # (not "kombu": its integration tests put ".." on sys.path)
    prefix = f"{project}-{ver}/t/"
    with tarfile.open(tarball) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        for m in members:
            m.name = m.name[len(f"{project}-{ver}/"):]
        tar.extractall(root, members=members, filter="data")
    return root


def shmq_source(spec: str | None, workdir: str) -> tuple[str | None, str]:
    """(a directory to put first on PYTHONPATH, the shmq revision under test) for ``spec``:
    None, the shmq this venv imports (its git commit, "+dirty" if its shmq/ has changes);
    a directory holding a ``shmq/`` package; or a git revision of this repository,
    exported into ``workdir`` and its C extension built there (what a commit does,
    whatever the work tree holds)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if spec is None:
        return None, shmq_revision()
    if os.path.isdir(os.path.join(spec, "shmq")):
        return os.path.abspath(spec), f"tree {os.path.abspath(spec)}"
    commit = subprocess.run(["git", "rev-parse", "--short", spec], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.strip()
    dest = os.path.join(workdir, f"shmq-{commit}")
    os.makedirs(dest)
    archive = subprocess.run(["git", "archive", commit, "shmq", "setup.py", "pyproject.toml", "README.md"],
                             cwd=repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=dest, capture_output=True,
                   check=True)
    return dest, commit


def with_path(env: dict, *dirs) -> dict:
    """``env`` with ``dirs`` (those not None) first on PYTHONPATH."""
    parts = [d for d in dirs if d] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(parts)} if parts else env


def ensure_modules(modules: dict) -> str | None:
    """A directory to put first on PYTHONPATH holding what the suite imports and this
    venv lacks ({module: pip requirement}), pip-installed into ~/.cache/shmq-peers/deps (the
    venv itself is left as it is); None if nothing is missing."""
    import importlib.util

    missing = [req for mod, req in modules.items() if importlib.util.find_spec(mod) is None]
    deps = os.path.join(CACHE, "deps")
    if missing:
        sys.path.insert(0, deps)
        import importlib

        importlib.invalidate_caches()
        missing = [req for mod, req in modules.items() if importlib.util.find_spec(mod) is None]
        sys.path.remove(deps)
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", deps, *missing], check=True)
    return deps if os.path.isdir(deps) else None


class Redis:
    """``redis-server`` on a free loopback port, nothing saved."""

    def __init__(self, workdir: str):
        self.port = free_port()
        self.log = open(os.path.join(workdir, f"redis-{self.port}.log"), "w")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", workdir], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        _stop(self.proc)
        self.log.close()


class Shmq:
    """A fresh shmq namespace; with ``tcp``, a ``shmq server`` on it (a free port, a
    token, no data dir). ``stop`` ends the server and destroys the namespace."""

    def __init__(self, workdir: str, tcp: bool, prefix: str = "peer"):
        self.namespace = prefix + uuid.uuid4().hex[:8]
        self.proc = None
        self.log = None
        if not tcp:
            return
        self.token = uuid.uuid4().hex
        path = os.path.join(workdir, f"{self.namespace}.token")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self.token)
        self.log_path = os.path.join(workdir, f"{self.namespace}.log")
        self.log = open(self.log_path, "w+")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "shmq", "server", "--namespace", self.namespace,
                                      "--no-persist", "--port", "0", "--token-file", path, "--log-level", "info"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"serving namespace \S+ on \S+:(\d+)", read_text(self.log_path))
            if m:
                self.port = int(m.group(1))
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        log = read_text(self.log_path)[-2000:]
        self.stop()
        raise RuntimeError(f"the server did not start: {log}")

    def url(self) -> str:
        """kombu's url of this broker: a local attach, or the server with its token."""
        if self.proc is None:
            return f"shmq:///{self.namespace}"
        return f"shmq://:{self.token}@127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)
            self.log.close()
        subprocess.run([sys.executable, "-m", "shmq", "namespace", "destroy", self.namespace, "--yes"],
                       capture_output=True, check=False)


def _stop(proc, timeout: float = 20) -> None:
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _killpg(proc) -> None:
    """End the process group that ``proc`` leads (pytest and the pool processes it forked)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            continue
        time.sleep(0.5)  # (the group's other members: let them see the TERM)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def write_ini(root: str, lines: list[str]) -> None:
    """``root``/pytest.ini: the peer's own settings, and peer_deadline beside it."""
    with open(os.path.join(root, "pytest.ini"), "w") as f:
        f.write("[pytest]\n" + "".join(line + "\n" for line in lines))
    shutil.copy(PLUGIN, os.path.join(root, "peer_deadline.py"))


def run_pytest(root: str, paths: list[str], options: list[str], env: dict, deadline: float, log_path: str) -> dict:
    """Run ``python -m pytest options paths`` in ``root`` until every test collected has
    an outcome: {test id: {"outcome", "reason", "longrepr", "seconds"}}. A run that dies,
    or stays silent past a test's deadline plus HARD_GRACE, has its process group killed;
    its test under way is a "timeout" and the others not run yet run again (named by id)."""
    results, collected, started_at = {}, None, time.monotonic()
    with open(log_path, "a") as log:
        while True:
            todo = None if collected is None else [t for t in collected if t not in results]
            if todo == [] or STOP.is_set():
                break
            jsonl = tempfile.mktemp(prefix="results-", suffix=".jsonl", dir=root)
            cmd = [sys.executable, "-m", "pytest", "-p", "peer_deadline", "-p", "no:cacheprovider",
                   f"--peer-deadline={deadline}", f"--peer-results={jsonl}", "-rA", *options, *(todo or paths)]
            log.write(f"\n$ {' '.join(cmd[:8])} ... ({len(todo) if todo else 'all'} tests)\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            hung = _watch(proc, jsonl, deadline + HARD_GRACE)
            _killpg(proc)
            lines = _read_jsonl(jsonl)
            if os.path.exists(jsonl):
                os.unlink(jsonl)
            if STOP.is_set():
                break
            for line in lines:
                if "collected" in line and collected is None:
                    collected = line["collected"]
            got = {t: r for t, r in _outcomes(lines).items() if t not in results}
            results.update(got)
            current = _under_way(lines)
            if current and current not in results:
                tail = _tail(log_path)
                if hung:
                    why = "hung, silent past its deadline: its pytest was killed"
                elif "Timeout (" in tail:
                    why = "hung past its deadline (in C?): faulthandler ended its pytest"
                else:
                    why = f"its pytest died (exit {proc.returncode})"
                results[current] = {"outcome": "timeout", "reason": why, "longrepr": tail, "seconds": None}
            elif not got:  # no progress: a collection error, or a death before the first test
                for t in (collected or []):
                    results.setdefault(t, {"outcome": "error", "longrepr": _tail(log_path), "seconds": None,
                                           "reason": f"not run: pytest ended (exit {proc.returncode})"})
                if collected is None:
                    results["<collection>"] = {"outcome": "error", "reason": "collection failed",
                                               "longrepr": _tail(log_path), "seconds": None}
                break
    return {"tests": results, "seconds": round(time.monotonic() - started_at, 1)}


def _watch(proc, jsonl: str, silence: float) -> bool:
    """Wait for ``proc``; True if it was silent (no line in ``jsonl``) for ``silence`` s."""
    last, size = time.monotonic(), -1
    while proc.poll() is None and not STOP.is_set():
        try:
            now_size = os.path.getsize(jsonl)
        except OSError:
            now_size = -1
        if now_size != size:
            size, last = now_size, time.monotonic()
        elif time.monotonic() - last > silence:
            return True
        time.sleep(0.5)
    return False


def _read_jsonl(path: str) -> list[dict]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # (the last line of a killed writer)
    except OSError:
        pass
    return out


def _outcomes(lines: list[dict]) -> dict:
    """{test id: result} of the tests whose three phases (or a failed setup) are in ``lines``."""
    phases, subtests = {}, {}
    for line in lines:
        if line.get("when") == "subtest":
            if line["outcome"] == "failed":
                subtests.setdefault(line["nodeid"], line)
        elif "when" in line:
            phases.setdefault(line["nodeid"], {})[line["when"]] = line
    out = {}
    for nodeid, ph in phases.items():
        if "teardown" not in ph:
            continue
        setup, call, teardown = ph.get("setup"), ph.get("call"), ph["teardown"]
        seconds = round(sum(p.get("duration") or 0 for p in ph.values()), 2)
        if setup and setup["outcome"] == "failed":
            outcome, bad = "error", setup
        elif setup and setup["outcome"] == "skipped":
            outcome, bad = "skipped", setup
        elif call and call["outcome"] == "failed":  # (a strict xfail that passed too: "[XPASS(strict)]")
            outcome, bad = "failed", subtests.get(nodeid, call)  # (its failed subtest says more than "contains 1")
        elif call and call.get("wasxfail") is not None:
            outcome, bad = ("xfailed" if call["outcome"] == "skipped" else "xpassed"), call
        elif call and call["outcome"] == "skipped":
            outcome, bad = "skipped", call
        elif teardown["outcome"] == "failed":
            outcome, bad = "error", teardown
        elif nodeid in subtests:  # the test passed, one of its subtests did not
            outcome, bad = "failed", subtests[nodeid]
        else:
            outcome, bad = "passed", None
        out[nodeid] = {"outcome": outcome, "reason": bad["reason"] if bad else "",
                       "longrepr": bad["longrepr"] if bad and outcome in ("failed", "error") else "",
                       "seconds": seconds}
        if outcome == "error" and bad is teardown and call and call["outcome"] == "passed":
            out[nodeid]["reason"] = "teardown: " + out[nodeid]["reason"]
    return out


def _under_way(lines: list[dict]) -> str | None:
    """The test whose start is the last line's, if it has no teardown."""
    current = None
    for line in lines:
        if line.get("start"):
            current = line["start"]
        elif line.get("when") == "teardown" and line["nodeid"] == current:
            current = None
    return current


def _tail(path: str, n: int = 6000) -> str:
    with open(path, errors="replace") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - n))
        return f.read()


def counts(tests: dict) -> dict:
    out = {}
    for r in tests.values():
        out[r["outcome"]] = out.get(r["outcome"], 0) + 1
    return dict(sorted(out.items()))


def report(target: str, result: dict) -> None:
    """Print ``target``'s counts, then each test that did not pass or skip, with its reason."""
    tests = result["tests"]
    print(f"\n== {target}: " + " ".join(f"{k}={v}" for k, v in counts(tests).items()) +
          f"  ({result['seconds']:.0f} s)", flush=True)
    for nodeid, r in sorted(tests.items()):
        if r["outcome"] in ("failed", "error", "timeout"):
            print(f"  {r['outcome'].upper():8} {nodeid}\n           {r['reason'][:300]}", flush=True)


def shmq_revision() -> str:
    """The commit of this repository's shmq, with "+dirty" if its shmq/ has changes."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "shmq"], cwd=root, capture_output=True,
                               text=True, check=False).stdout.strip()
    except OSError:
        return "?"
    return head + ("+dirty" if dirty else "")


def write_out(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)


def targets_of(spec: str, known: tuple) -> list[str]:
    """The targets of ``--target``: "all", or names separated by commas."""
    names = list(known) if spec == "all" else [t.strip() for t in spec.split(",") if t.strip()]
    bad = [t for t in names if t not in known]
    if bad:
        raise SystemExit(f"unknown target {', '.join(bad)}: {', '.join(known)} or all")
    return names


def run_targets(targets: list[str], jobs: int, run_one, on_done) -> None:
    """``run_one(target)`` for each target, ``jobs`` at a time (each on brokers of its own:
    the suites mostly wait, so targets side by side cost little), ``on_done(target,
    result)`` as each ends. SIGTERM ends the run as Ctrl-C does: servers stopped,
    namespaces destroyed."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def interrupt(signum, frame):
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, interrupt)
    pool = ThreadPoolExecutor(max(1, jobs))
    try:
        futures = {pool.submit(run_one, t): t for t in targets}
        for f in as_completed(futures):
            on_done(futures[f], f.result())
    except BaseException:
        STOP.set()  # each run kills its pytest and stops its brokers
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_and_close(targets: list[str], jobs: int, run_one, on_done, out_path, out: dict, keep: bool,
                  workdir: str) -> int:
    """``run_targets``, then the outcomes written to ``out_path`` (if any) and the work dir
    removed (unless ``keep``); 130 when interrupted (the targets' servers are stopped)."""
    try:
        try:
            run_targets(targets, jobs, run_one, on_done)
        except KeyboardInterrupt:
            print("interrupted: the targets' servers stopped, their namespaces destroyed", flush=True)
            return 130
    finally:
        if out_path:
            write_out(out_path, out)
        if keep:
            print(f"work dir kept: {workdir}")
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    return 0
