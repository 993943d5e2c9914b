"""A pytest plugin for a peer's suite run by tests/peers/pysuites.py (copied beside the
suite, loaded with ``-p peer_deadline``): a deadline per test, and each test's outcome
written as it ends. Not a test module of shmq's.

- ``--peer-deadline S``: each test (setup, call and teardown together) gets S seconds, or
  its own ``@pytest.mark.timeout(N)`` if that is less (pytest-timeout's mark, which the
  suites carry; pytest-timeout itself need not be installed). Past it, SIGALRM fails the
  test where it stands, with every thread's stack in the failure; if that does not end
  it (a wait in C that does not give way to signal handlers), faulthandler ends the
  process 30 s later and the runner goes on in a new one.
- ``--peer-results FILE``: JSON lines: the tests collected, each test's start, and each
  report (phase, outcome, one-line reason, the traceback of a failure).
- ``$PEER_IMPORTS``: modules to import first (``shmq.kombu`` registers kombu's transport).
"""

import faulthandler
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback

import pytest

HARD_AFTER = 30.0
_STDERR = os.fdopen(os.dup(2), "w")  # (taken before pytest captures fd 2: faulthandler's dump must be seen)
_out = None
_limit = None
_hard_at = None  # time.monotonic() at which faulthandler ends the process (None: no test under way)

for _name in filter(None, os.environ.get("PEER_IMPORTS", "").split(",")):
    importlib.import_module(_name)


def pytest_addoption(parser):
    parser.addoption("--peer-deadline", type=float, default=0.0, help="seconds per test (0: none)")
    parser.addoption("--peer-results", default=None, help="JSON lines of outcomes, written as tests end")


def pytest_configure(config):
    global _out
    path = config.getoption("--peer-results")
    if path:
        _out = open(path, "a")  # noqa: SIM115 - the session's, written to the end


def _write(obj) -> None:
    if _out is not None:
        _out.write(json.dumps(obj) + "\n")
        _out.flush()


def pytest_collection_finish(session):
    _write({"collected": [item.nodeid for item in session.items]})


def _stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


def _on_alarm(signum, frame):
    pytest.fail(f"peer_deadline: still running after {_limit:g} s\n{_stacks()}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _limit, _hard_at
    _write({"start": item.nodeid})
    limit = item.config.getoption("--peer-deadline") or None
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        own = mark.kwargs.get("timeout", mark.args[0] if mark.args else None)
        if own:
            limit = min(limit, float(own)) if limit else float(own)
    if limit:
        _limit, _hard_at = limit, time.monotonic() + limit + HARD_AFTER
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
        faulthandler.dump_traceback_later(limit + HARD_AFTER, exit=True, file=_STDERR)
    try:
        yield
    finally:
        if limit:
            _hard_at = None
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_exception_interact(node, call, report):
    """pytest's own faulthandler plugin cancels every pending dump when a phase fails:
    the test's teardown (a fixture that waits on the worker) is bounded still."""
    if _hard_at is not None:
        faulthandler.dump_traceback_later(max(1.0, _hard_at - time.monotonic()), exit=True, file=_STDERR)


def _reason(report) -> str:
    """One line: the failure's message, or the skip's or xfail's reason."""
    if getattr(report, "wasxfail", None) is not None and not report.failed:
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        lines = [line.strip() for line in crash.message.splitlines() if line.strip()]
        return lines[0] if lines and "peer_deadline:" in lines[0] else " | ".join(lines[:3])
    text = str(longrepr or "").strip().splitlines()
    return text[-1] if text else ""


def pytest_runtest_logreport(report):
    subtest = type(report).__name__.lower().startswith("subtest") or hasattr(report, "context")
    line = {"nodeid": report.nodeid, "when": "subtest" if subtest else report.when, "outcome": report.outcome,
            "duration": report.duration, "wasxfail": getattr(report, "wasxfail", None), "reason": "", "longrepr": ""}
    if report.failed or report.skipped:
        line["reason"] = _reason(report)
    if report.failed:
        line["longrepr"] = report.longreprtext
    if subtest:
        line["reason"] = f"subtest {getattr(report, 'context', '')}: {line['reason']}"
    _write(line)
