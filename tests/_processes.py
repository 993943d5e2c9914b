"""How the suite starts the worker processes of its multi-process and fault tests:
``WORKERS``, a ``forkserver`` context whose server has imported shmq, pytest and the
workers' modules once. A worker is a fork of that server (a few milliseconds), not a new
interpreter importing them again (about 0.3 CPU-seconds each, and a SIGKILL test starts
dozens). It starts as spawn's workers do: no threads, none of the test's state, its target
named by module.

What it does not take from the test is the environment: a worker has the server's, which
conftest starts once per session (``start``), before any test. A test whose workers need
an environment of their own, or that is about how a process starts, uses spawn.

The suite's command lines and ``shmq server`` processes start the same way
(``start_module``, ``run_module``: ``python -m MODULE`` in a fork, with the environment
given), unless that environment changes what a new interpreter reads at its start.
"""

import atexit
import gc
import io
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing import reduction

from bench import harness
from shmq.cli import app

# what the server imports once: the benches' roles' (a bench run in a test forks from it), the
# command line's (run_module), pytest and the workers' modules
PRELOAD = (harness.PRELOAD + ("shmq.cli",) + tuple(sorted({f"shmq.cli.{m}" for m in app.COMMANDS.values()}))
           + ("pytest", "tests._workers", "tests._wait"))


def context():
    """The context the suite's workers start in (its server imports ``PRELOAD``)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


WORKERS = context()


def start():
    """Start the server now, with the environment the session has (conftest: once, before
    any test), unless one runs."""
    global _started
    context()
    if server_pid() is None:
        env = dict(os.environ)
        multiprocessing.forkserver.ensure_running()
        _started = (server_pid(), env)


server_pid = harness.server_pid  # (the running server's pid: a process of the session, not a stray)


# ---------------------------------------------------------------- a command, run as a fork
# What a new interpreter reads from the environment at its start or at shmq's import, which a
# fork of the server has read already: a command whose environment changes one runs anew.
_READ_AT_START = ("PYTHON", "SHMQ_PURE_PYTHON", "LANG", "LC_")
_started = (None, {})  # (the pid of the server start() started, the environment it started with)


def _forkable(env) -> bool:
    pid, started_with = _started
    if pid is None or server_pid() != pid:
        return False
    paths = {os.path.abspath(p) for p in sys.path}  # (what a fork's imports search: this process's path)
    if not all(os.path.abspath(p) in paths for p in env.get("PYTHONPATH", "").split(os.pathsep) if p):
        return False  # (a folder of its own: a sitecustomize, say)
    return all(env.get(k) == started_with.get(k) for k in set(env) | set(started_with)
               if k.startswith(_READ_AT_START) and k != "PYTHONPATH")


def start_module(module, args, *, env=None, stdin=None, stdout=None, stderr=None):
    """``python -m module *args`` started with ``env`` (default: this process's): a fork of the
    server running the module as ``-m`` runs it (``runpy``: its ``__main__``, ``sys.argv``, the
    exit code of its SystemExit, its threads joined and atexit handlers run at its end), or a
    new interpreter (``subprocess.Popen``) where the environment changes what one reads at its
    start (``_READ_AT_START``, a folder on PYTHONPATH) or no server runs. ``stdin``,
    ``stdout``, ``stderr``: a descriptor, or ``subprocess.PIPE`` (stderr only, read as text
    from ``.stderr``), or None (this process's). Returns what the suite uses of a Popen."""
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", module, *args]
    if not _forkable(env):
        return subprocess.Popen(argv, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                text=True if stderr == subprocess.PIPE else None)
    return Forked(argv, module, args, env, stdin, stdout, stderr)


def run_module(module, args, *, env=None, stdin=None, timeout=60):
    """``start_module`` run to its end with ``stdin`` (text) and ``timeout``: what
    ``subprocess.run(..., capture_output=True, text=True)`` returns."""
    with tempfile.TemporaryDirectory(prefix="shmq-run-") as folder:
        files = []
        for name, mode in (("in", "w+"), ("out", "w+b"), ("err", "w+b")):
            files.append(open(os.path.join(folder, name), mode))
        try:
            files[0].write(stdin or "")
            files[0].seek(0)
            proc = start_module(module, args, env=env, stdin=files[0].fileno() if stdin is not None else subprocess.DEVNULL,
                                stdout=files[1].fileno(), stderr=files[2].fileno())
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            out, err = (_text(f) for f in files[1:])
        finally:
            for f in files:
                f.close()
    return subprocess.CompletedProcess([sys.executable, "-m", module, *args], code, out, err)


def _text(f):
    """A file's bytes decoded as ``text=True`` decodes a pipe's (the locale's, newlines made \\n)."""
    f.seek(0)
    return io.TextIOWrapper(io.BytesIO(f.read())).read()


class Forked:
    """A module run in a fork of the server: the part of ``subprocess.Popen`` the suite uses
    (``pid``, ``poll``, ``wait``, ``returncode``, ``send_signal``, ``terminate``, ``kill``,
    ``stderr``, ``args``)."""

    def __init__(self, argv, module, args, env, stdin, stdout, stderr):
        self.args, self.stderr = argv, None
        fds, read_end = [], None
        for number, given in ((0, stdin), (1, stdout), (2, stderr)):
            if given == subprocess.PIPE:
                read_end, given = os.pipe()
            elif given == subprocess.DEVNULL:
                given = os.open(os.devnull, os.O_RDWR)
            elif given is None:
                given = os.dup(number)
            else:
                given = os.dup(given)
            fds.append(given)
        try:
            self._process = WORKERS.Process(target=_run_module, args=(module, list(args), env, os.getcwd(),
                                                                      [_Fd(fd) for fd in fds]))
            self._process.start()
        finally:
            for fd in fds:
                os.close(fd)
        if read_end is not None:
            self.stderr = open(read_end, encoding=None)
        self.pid = self._process.pid

    @property
    def returncode(self):
        return self._process.exitcode

    def poll(self):
        return self._process.exitcode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def send_signal(self, sig):
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


class _Fd:
    """A descriptor a fork of the server is given (sent with its start, as a Connection's is)."""

    def __init__(self, fd):
        self.fd = fd

    def __reduce__(self):
        return _Fd._received, (reduction.DupFd(self.fd),)

    @staticmethod
    def _received(dup):
        return _Fd(dup.detach())


def _run_module(module, args, env, cwd, fds):
    """In the fork: the environment and standard streams of the command, then the module."""
    gc.freeze()  # what the server imported (pytest, the benches...) out of the collector's sight: a
    # fork's full collections are then no longer than a new interpreter's (a loaded run saw a server's
    # snapshots start 0.1 s late without this)
    os.environ.clear()
    os.environ.update(env)
    time.tzset()
    os.chdir(cwd)
    for number, given in enumerate(fds):
        os.dup2(given.fd, number)
        os.close(given.fd)
    sys.stdin = open(0, closefd=False)  # (multiprocessing gave the fork /dev/null)
    sys.argv = ["-m", *args]  # (runpy sets argv[0] to the module's file)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # as the interpreter ends on one
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    threading._shutdown()  # then, as an interpreter's end: its threads joined, its atexit handlers run
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
