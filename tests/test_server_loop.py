"""The event loop ``shmq server`` runs on (``shmq.server.loops``): uvloop where it is
installed, asyncio's own on request (``--loop``, ``$SHMQ_LOOP``), said in the start-up line."""

import importlib.util
import os
import subprocess
import sys

import pytest

import shmq
from shmq.server import loops

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP_CHOICES = ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(not HAVE_UVLOOP,
                                                                            reason="uvloop is not installed"))]


def _started_on(srv) -> str:
    """The loop the server's start-up line names (its text and its ``loop=`` field agree)."""
    (line,) = [line for line in srv.log if "serving namespace" in line]
    said = [name for name in ("asyncio", "uvloop") if f"; {name} event loop" in line]
    assert len(said) == 1 and f" loop={said[0]}" in line, line
    return said[0]


def _round_trip(url):
    with shmq.connect(url) as b:
        q = b.queue("jobs")
        ids = q.put_many([b"a", b"b"])
        q.put(b"c", headers={"k": 1})
        ds = q.get_many(10, timeout=5)
        assert [(d.id, d.body) for d in ds] == [(ids[0], b"a"), (ids[1], b"b"), (ids[1] + 1, b"c")]
        assert ds[2].headers == {"k": 1}
        assert q.ack_many(ds) == 3
        assert q.stats().ready == q.stats().in_flight == 0


@pytest.mark.parametrize("loop", LOOP_CHOICES)
def test_the_server_serves_on_the_loop_asked_for(broker, servers, loop):
    broker.create_queue("jobs")
    srv = servers(broker.namespace, "--no-persist", "--loop", loop)
    assert _started_on(srv) == loop
    _round_trip(srv.url)
    assert srv.stop() == 0


def test_auto_is_uvloop_where_it_is_installed(broker, servers):
    broker.create_queue("jobs")
    srv = servers(broker.namespace, "--no-persist")  # --loop auto
    assert _started_on(srv) == ("uvloop" if HAVE_UVLOOP else "asyncio")
    _round_trip(srv.url)
    assert srv.stop() == 0


def test_the_loop_can_be_chosen_by_the_environment(broker, servers, monkeypatch):
    broker.create_queue("jobs")
    monkeypatch.setenv("SHMQ_LOOP", "asyncio")
    srv = servers(broker.namespace, "--no-persist")
    assert _started_on(srv) == "asyncio"
    assert srv.stop() == 0


def test_an_unknown_loop_is_refused_before_anything_starts(namespace):
    r = subprocess.run([sys.executable, "-m", "shmq.cli", "server", "--namespace", namespace, "--port", "0",
                        "--no-persist"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": ROOT, "SHMQ_LOOP": "trio"})
    assert r.returncode == 2 and "'trio' is not one of 'auto', 'asyncio', 'uvloop'" in r.stderr


def test_resolve_picks_and_refuses(monkeypatch):
    assert loops.resolve("asyncio") == "asyncio"
    assert loops.resolve("auto") == ("uvloop" if HAVE_UVLOOP else "asyncio")
    with pytest.raises(ValueError, match="the event loop must be one of auto, asyncio, uvloop, not 'tokio'"):
        loops.resolve("tokio")
    monkeypatch.setattr(loops.importlib.util, "find_spec", lambda name: None)  # as if uvloop were not installed
    assert loops.resolve("auto") == "asyncio"
    with pytest.raises(ValueError, match="uvloop is not installed"):
        loops.resolve("uvloop")


@pytest.mark.parametrize("loop", LOOP_CHOICES)
def test_run_runs_a_coroutine_on_that_loop(loop):
    async def which():
        import asyncio

        return loops.loop_name(asyncio.get_running_loop())

    assert loops.run(which(), loop) == loop
