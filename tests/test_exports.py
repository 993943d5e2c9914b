"""The public surface: exactly these names, one exception hierarchy."""

import queue
import subprocess
import sys

import shmq
from shmq import errors


def test_all_exports_exist():
    for name in shmq.__all__:
        assert hasattr(shmq, name), name
    assert {"connect", "Broker", "Queue", "Delivery", "QueueStats"} <= set(shmq.__all__)


def test_one_exception_hierarchy():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, shmq.ShmqError)
        assert getattr(shmq, name) is cls
    assert issubclass(shmq.QueueFull, queue.Full)
    assert issubclass(shmq.QueueEmpty, queue.Empty)
    # errors.__all__ is the one list: every exception errors.py defines, and shmq's exceptions are those
    defined = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, shmq.ShmqError)}
    assert defined == set(errors.__all__) and len(errors.__all__) == len(defined)
    assert {n for n in shmq.__all__ if isinstance(getattr(shmq, n), type)
            and issubclass(getattr(shmq, n), BaseException)} == defined


def test_shmq_aio_is_a_module_that_loads_asyncio_only_when_imported():
    """``import shmq.aio`` and ``from shmq.aio import connect`` work as the docs write them;
    ``import shmq`` alone still loads no asyncio, ``shmq.aio`` is the same module, and its
    ``connect`` (which chooses the TCP client or the engine's asyncio face) loads no engine
    until it attaches locally."""
    code = ("import sys\n"
            "import shmq\n"
            "assert 'asyncio' not in sys.modules, 'import shmq loaded asyncio'\n"
            "import shmq.aio\n"
            "from shmq.aio import AsyncBroker, connect\n"
            "import shmq.client.aio as impl\n"
            "assert shmq.aio is sys.modules['shmq.aio']\n"
            "assert AsyncBroker is impl.AsyncBroker and connect.__module__ == 'shmq.aio'\n"  # (it chooses)
            "assert sorted(shmq.aio.__all__) == sorted(impl.__all__)\n"
            "assert all(getattr(shmq.aio, n) is getattr(impl, n) for n in impl.__all__ if n != 'connect')\n"
            "assert 'shmq.engine' not in sys.modules, 'import shmq.aio loaded the engine'\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
    lazy = subprocess.run([sys.executable, "-c", "import sys, shmq\nf = shmq.aio.connect\n"
                           "assert sys.modules['shmq.aio'] is shmq.aio\nprint(f.__module__)"],
                          capture_output=True, text=True, timeout=60)
    assert (lazy.returncode, lazy.stdout) == (0, "shmq.aio\n"), lazy.stderr
