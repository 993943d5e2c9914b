"""Riding out an outage of the server a query reaches over ``url`` (issue 69, item 5), on a fake
clock: ``shmq.spark.outage.ride_out`` (the Python source, the Python sink, the JVM sink's
publisher) and its JVM twin ``io.shmq.spark.tcp.Reconnect`` (the JVM source) try again at once,
then after pauses drawn below a bound doubling from 0.1 s to at most 2 s (the Python clients'
backoff), until option maxOutage (by default the Python clients' max_outage, 300 s, taken in
options.py and written into the jar) has passed since the first failure; one warning per
outage, none per try; nothing but an unreachable server (or a refusal for a limit) is tried
again. tests/spark/test_restart.py holds real queries to a real SIGKILL and restart."""

import importlib
import logging
import re
import ssl
import zipfile

import pytest

from shmq.errors import BrokerUnavailable, LimitExceeded, StreamNotFound, Unauthorized
from shmq.spark import outage
from shmq.spark.jar import DEFAULTS, jar
from shmq.client.options import DEFAULT_MAX_OUTAGE_S, ConnectOptions
from shmq.spark.options import MAX_OUTAGE_S, RECONNECT_PAUSES_S, Options, SpecError, jvm_defaults
from tests.spark.jvm_harness import run_java, skip_without_jdk

URL = "tcp://:s3cret@127.0.0.1:9"
jar_module = importlib.import_module("shmq.spark.jar")  # (shmq.spark.jar, the attribute, is its function jar)


@pytest.fixture
def clock(monkeypatch):
    """The fake clock ride_out runs on: ``clock.slept``, the pauses it slept."""

    class Clock:
        now = 1000.0
        slept = []

        def sleep(self, s):
            self.slept.append(s)
            self.now += s

    c = Clock()
    c.slept = []
    monkeypatch.setattr(outage, "_sleep", c.sleep)
    monkeypatch.setattr(outage, "_clock", lambda: c.now)
    monkeypatch.setattr(outage, "_out", set())
    return c


def failing(n, error=None):
    """A call that raises ``error`` (a refused connection) its first ``n`` times, then returns "ok"."""
    left = [n]

    def call():
        if left[0] > 0:
            left[0] -= 1
            raise error or BrokerUnavailable("cannot connect to 127.0.0.1:9: Connection refused")
        return "ok"

    return call


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "shmq.spark" and r.levelno == logging.WARNING]


def test_the_option_and_its_default():
    assert (MAX_OUTAGE_S, RECONNECT_PAUSES_S) == (DEFAULT_MAX_OUTAGE_S, ConnectOptions().backoff)  # the clients'
    assert MAX_OUTAGE_S >= 60  # (issue 69: a query rides out a restart of at least 60 s by default)
    assert Options({"stream": "s", "url": URL}).max_outage == MAX_OUTAGE_S
    seconds = {"90": 90, "2.5": 2.5, "500ms": 0.5, "90s": 90, "5m": 300, "0": 0, "1h": 3600}
    for raw, want in seconds.items():
        assert Options({"stream": "s", "url": URL, "maxOutage": raw}).max_outage == want
    with pytest.raises(SpecError, match=r"^option maxOutage must be seconds \(300\) or a duration like 500ms, "
                                        r"90s or 5m, not '-1'$"):
        Options({"stream": "s", "url": URL, "maxoutage": "-1"})
    assert jvm_defaults().splitlines()[1:] == [f"maxOutage={MAX_OUTAGE_S!r}",
                                               f"reconnectFirstPause={RECONNECT_PAUSES_S[0]!r}",
                                               f"reconnectMostPause={RECONNECT_PAUSES_S[1]!r}"]


def test_a_call_is_made_again_with_doubling_pauses_and_one_warning(clock, caplog):
    opts = Options({"stream": "s", "url": URL, "maxOutage": "10"})
    resets = []
    assert outage.ride_out(opts, "source (the driver)", failing(6), reset=lambda: resets.append(1)) == "ok"
    assert len(resets) == 6
    assert len(clock.slept) == 5  # the first try again at once
    for pause, step in zip(clock.slept, [0.1, 0.2, 0.4, 0.8, 1.6]):
        assert 0 <= pause <= step
    assert warnings(caplog) == ["shmq source (the driver): the server at tcp://127.0.0.1:9 cannot be reached (cannot "
                                "connect to 127.0.0.1:9: Connection refused); trying again for up to 10s (option "
                                "maxOutage)"]  # (never the url's token)
    clock.slept.clear()
    assert outage.ride_out(Options({"stream": "s", "url": URL}), "sink", failing(60)) == "ok"  # a long outage:
    # within the default, and the pauses stop growing at 2 s
    assert len(clock.slept) == 59 and max(clock.slept) <= 2.0 and sum(clock.slept) > 30
    assert len(warnings(caplog)) == 2  # one per outage


def test_it_gives_up_once_max_outage_has_passed(clock, caplog):
    opts = Options({"stream": "s", "url": URL, "maxOutage": "5s"})
    started = clock.now
    with pytest.raises(BrokerUnavailable, match=r"^cannot connect to 127.0.0.1:9: Connection refused \(the shmq "
                                                r"sink \(task 3\) tried \d+ times in 5s: option maxOutage "
                                                r"is 5s\)$"):
        outage.ride_out(opts, "sink (task 3)", failing(10**6))
    assert clock.now - started == pytest.approx(5.0)  # the last pause cut to what was left
    # the same outage met by another call: tried again, not said again
    assert outage.ride_out(opts, "sink (task 4)", failing(3)) == "ok"
    assert len(warnings(caplog)) == 1
    assert outage.ride_out(opts, "sink (task 4)", failing(2)) == "ok"  # after an answer, a new outage
    assert len(warnings(caplog)) == 2


def test_a_refusal_for_a_limit_is_tried_again(clock, caplog):
    """A stopping server refuses new connections (LIMIT_EXCEEDED, "the server is stopping"), and so
    does one whose cap on connections every client a restart dropped meets at once: nothing was
    done, so it is tried again."""
    opts = Options({"stream": "s", "url": URL})
    assert outage.ride_out(opts, "source", failing(3, LimitExceeded("the server is stopping"))) == "ok"
    assert len(clock.slept) == 2 and len(warnings(caplog)) == 1


def test_only_an_unreachable_server_is_tried_again(clock, caplog):
    opts = Options({"stream": "s", "url": URL})
    for error in (Unauthorized("refused"), StreamNotFound("no stream 's'")):
        with pytest.raises(type(error)):
            outage.ride_out(opts, "source", failing(1, error))
    untrusted = BrokerUnavailable("cannot connect to 127.0.0.1:9: TLS certificate verify failed")
    untrusted.__context__ = ssl.SSLCertVerificationError("certificate verify failed")
    with pytest.raises(BrokerUnavailable, match="verify failed"):
        outage.ride_out(opts, "source", failing(1, untrusted))
    local = Options({"stream": "s", "namespace": "n"})  # a namespace: no server to wait for
    with pytest.raises(BrokerUnavailable):
        outage.ride_out(local, "source", failing(1))
    assert clock.slept == [] and warnings(caplog) == []


def test_max_outage_0_tries_again_at_once_only(clock, caplog):
    opts = Options({"stream": "s", "url": URL, "maxOutage": "0"})
    assert outage.ride_out(opts, "source", failing(1)) == "ok"  # (a connection the server closed while idle)
    with pytest.raises(BrokerUnavailable, match=r"^cannot connect to 127.0.0.1:9: Connection refused$"):
        outage.ride_out(opts, "source", failing(2))
    assert clock.slept == [] and warnings(caplog) == []


def test_the_jvm_twin_on_a_fake_clock(classes):
    lines = run_java(classes, "io.shmq.spark.tcp.ReconnectCheck").stdout.splitlines()
    warn = ("warn shmq test: the server at tcp://127.0.0.1:9 cannot be reached (Connection refused); trying again for "
            "up to {}s (option maxOutage)")
    slept = [[int(x) for x in re.search(r"slept \[(.*)\]$", line).group(1).split(", ") if x]
             for line in lines if " slept " in line]
    outcomes = [re.sub(r" slept \[.*\]$", "", line) for line in lines]
    assert outcomes == [
        warn.format(10), "refused 6 times: ok resets 6",
        warn.format(3), f"refused for ever: IOException: Connection refused (the shmq test tried {len(slept[1]) + 2} "
                        "times in 3s: option maxOutage is 3s) resets " + str(len(slept[1]) + 2),
        "the same outage, refused twice more: ok resets 2",  # (no second warning: the same outage)
        warn.format(10), "a new outage, refused twice: ok resets 2",
        "an error reply: ServerException: 127.0.0.1:9: no stream 'x': status 18: no resets 0",
        "maxOutage 0, refused twice: ConnectException: Connection refused resets 2",
        "maxOutage 0, refused once: ok resets 1",
        "warn shmq test: the server at tcp://127.0.0.1:9 cannot be reached (127.0.0.1:9: LIMIT_EXCEEDED: the server is "
        "stopping); trying again for up to 10s (option maxOutage)",
        "a stopping server, twice: ok resets 2",  # (a refusal for a limit: nothing was done, tried again)
    ]
    for pause, step in zip(slept[0], [100, 200, 400, 800, 1600]):
        assert 0 <= pause <= step
    assert len(slept[0]) == 5 and 3000 <= sum(slept[1]) <= 3001 and max(slept[1]) <= 2000  # (whole ms, rounded up)
    assert slept[4:7] == [[], [], []] and len(slept[7]) == 1


def test_the_jar_carries_the_python_defaults(monkeypatch):
    """The connector's jar holds options.py's defaults (jar.py writes them), and its name's hash covers them:
    other defaults, another jar."""
    skip_without_jdk()
    path = jar()
    with zipfile.ZipFile(path) as z:
        assert z.read(DEFAULTS).decode() == jvm_defaults()
    monkeypatch.setattr(jar_module, "jvm_defaults", lambda: jvm_defaults() + "maxOutage=61.0\n")
    monkeypatch.setattr(jar_module, "_compile", lambda *args: "not built here")  # (the name is all this looks at)
    assert jar_module.build(jar_module.SOURCES) is None  # a jar of another name was wanted, and is not there
