"""The files made for another language from a Python owner (``shmq.mirrors``): each is
what its owner makes now, each says so on its first line, and no file in shmq/ says it
is generated without being one of them."""

import os
import subprocess
import sys

from shmq import mirrors

PACKAGE = os.path.dirname(os.path.abspath(mirrors.__file__))


def test_every_mirror_is_what_its_owner_makes_now():
    assert mirrors.stale() == [], "stale: run python -m shmq.mirrors"
    for mirror, (module, _function) in mirrors.MIRRORS.items():
        with open(mirrors.path(mirror)) as f:
            first = f.readline().strip()
        said = f"# {mirrors.banner(module)}" if mirror.endswith(".py") else f"/* {mirrors.banner(module)} */"
        assert first == said, mirror


def test_no_file_says_it_is_generated_without_being_a_mirror():
    said = set()
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith((".h", ".c", ".java", ".py")):
                path = os.path.join(root, name)
                with open(path, errors="replace") as f:
                    if "GENERATED" in f.readline():
                        said.add(os.path.relpath(path, PACKAGE).replace(os.sep, "/"))
    assert said == set(mirrors.MIRRORS)


def test_check_names_a_stale_mirror_and_the_writer_mends_it(tmp_path, monkeypatch):
    mirror = "server/_reply_budget.h"
    path = tmp_path / "_reply_budget.h"
    path.write_text("/* old */\n")
    monkeypatch.setattr(mirrors, "path", lambda m: str(path) if m == mirror else os.path.join(PACKAGE, *m.split("/")))
    assert mirrors.stale() == [mirror]
    assert mirrors.write_all() == [mirror]
    assert mirrors.stale() == [] and path.read_text() == mirrors.text(mirror)


def test_the_command_line_check_exits_0_on_the_tree():
    r = subprocess.run([sys.executable, "-m", "shmq.mirrors", "--check"], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")


def test_the_blocking_client_is_the_asyncio_ones_twin():
    from shmq.client import aio, remote, transport, transport_sync

    assert mirrors.unasync("async def f():\n    async with x:\n        await g()\n") == (
        "def f():\n    with x:\n        g()\n")
    assert mirrors.unasync("awaited = asynchronous; class AsyncTransport: ...") == (
        "awaited = asynchronous; class SyncTransport: ...")
    # what both transports share is written once: neither client redefines it
    shared = [n for n, v in vars(transport.AsyncTransport).items() if callable(v) and not n.startswith("__")]
    assert {"_reconnected", "_outlast", "_run", "_get_plain", "_put_plain", "_put_many_plain"} <= set(shared)
    for name in shared:
        assert getattr(aio.AsyncBroker, name) is getattr(transport.AsyncTransport, name), name
        assert getattr(remote.RemoteBroker, name) is getattr(transport_sync.SyncTransport, name), name
    assert remote._resuming is transport_sync._resuming and aio._polled is transport._polled
