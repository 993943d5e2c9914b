"""What a TCP handle is told at connect (shmq/client/options.py): URLs and the tokens they
carry, never shown; timeouts and the reconnect policy, checked. No socket, no server."""

from types import SimpleNamespace

import pytest

import shmq
from shmq.client.options import ConnectOptions, Endpoint, split_url
from shmq.protocol import MsgType

TOKEN = "s3cret-Token_42"


@pytest.mark.parametrize("url, expected", [
    ("tcp://127.0.0.1:7000", Endpoint("127.0.0.1", 7000, None, "tcp://127.0.0.1:7000")),
    ("tcp://localhost", Endpoint("localhost", 7878, None, "tcp://localhost")),
    (f"tcp://:{TOKEN}@127.0.0.1:7000", Endpoint("127.0.0.1", 7000, TOKEN, "tcp://127.0.0.1:7000")),
    (f"tcp://anyone:{TOKEN}@127.0.0.1:7000", Endpoint("127.0.0.1", 7000, TOKEN, "tcp://127.0.0.1:7000")),
    (f"tcp://127.0.0.1:7000?token={TOKEN}", Endpoint("127.0.0.1", 7000, TOKEN, "tcp://127.0.0.1:7000")),
    (f"tcp://:{TOKEN}@127.0.0.1:7000/?token={TOKEN}", Endpoint("127.0.0.1", 7000, TOKEN, "tcp://127.0.0.1:7000/")),
    ("tcp://:a%2Fb@[::1]:7000", Endpoint("::1", 7000, "a/b", "tcp://[::1]:7000")),
])
def test_a_url_gives_host_port_and_token_and_keeps_no_token(url, expected):
    assert split_url(url) == expected


@pytest.mark.parametrize("url, match", [
    (f"http://:{TOKEN}@host:1",
     r"^unsupported broker url 'http://\*\*\*@host:1': use tcp://host:port \(tcps://host:port: TLS\)$"),
    (f"tcp://:{TOKEN}@host:port", r"^broker url 'tcp://\*\*\*@host:port' has a bad port$"),
    (f"tcp://{TOKEN}@host:1", r"^broker url 'tcp://\*\*\*@host:1': put the token after a colon, tcp://:TOKEN@"),
    (f"tcp://host:1?token={TOKEN}&tls=1", r"^broker url 'tcp://host:1\?token=\*\*\*&tls=\*\*\*': unknown parameter "
                                          r"'tls' \(a url takes only token=\)$"),
    (f"tcp://:{TOKEN}@host:1?token=other",
     r"^broker url 'tcp://\*\*\*@host:1\?token=\*\*\*' gives two different tokens$"),
    ("tcp://:@host:1", r"^broker url 'tcp://\*\*\*@host:1': a token is not empty and has no spaces$"),
    ("tcp:///path", r"^unsupported broker url 'tcp:///path'"),
])
def test_a_bad_url_is_refused_without_showing_its_token(url, match):
    with pytest.raises(ValueError, match=match) as caught:
        split_url(url)
    assert TOKEN not in str(caught.value)


def test_connect_hides_the_token_of_an_unsupported_url_and_refuses_tcp_options_for_a_local_attach():
    with pytest.raises(ValueError, match=r"^unsupported broker url 'redis://\*\*\*@h:1': use no url") as caught:
        shmq.connect(f"redis://:{TOKEN}@h:1")
    assert TOKEN not in str(caught.value)
    with pytest.raises(ValueError, match="^reconnect, timeout: options of tcp:// urls, not of a local attach$"):
        shmq.connect(timeout=1, reconnect=False)
    with pytest.raises(TypeError):
        shmq.connect("tcp://127.0.0.1:1", retry=3)  # not an option


@pytest.mark.parametrize("options, match", [
    ({"timeout": 0}, "^timeout must be a positive number of seconds, not 0$"),
    ({"timeout": True}, "^timeout must be a positive number of seconds, not True$"),
    ({"connect_timeout": -1.0}, "^connect_timeout must be a positive number of seconds, not -1.0$"),
    ({"reconnect": 1}, "^reconnect must be True or False, not 1$"),
    ({"retries": -1}, "^retries must be a non-negative int, not -1$"),
    ({"backoff": 0.1}, r"^backoff must be \(first, most\) seconds, not 0.1$"),
    ({"backoff": (1.0, 0.5)}, r"^backoff must be \(first, most\) with first <= most, not \(1.0, 0.5\)$"),
    ({"backoff": (0.1, float("nan"))}, "^backoff must be a non-negative number of seconds, not nan$"),
    ({"max_outage": -1}, "^max_outage must be a non-negative number of seconds, not -1$"),
    ({"max_outage": "60"}, "^max_outage must be a non-negative number of seconds, not '60'$"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises(ValueError, match=match):
        ConnectOptions(**options)


def test_a_reconnect_tries_once_then_retries_times_with_jittered_pauses_up_to_the_most():
    top = SimpleNamespace(uniform=lambda low, high: high)  # each pause is drawn in [0, this]: tests/test_client_resume.py
    assert list(ConnectOptions(retries=5, backoff=[0.1, 0.5]).pauses(top)) == [0.0, 0.1, 0.2, 0.4, 0.5, 0.5]
    assert list(ConnectOptions(retries=0).pauses()) == [0.0]


def test_long_lived_consumers_ride_out_a_minute_and_more_by_default_with_pauses_capped_at_the_most():
    options = ConnectOptions()
    assert options.max_outage >= 60  # a routine restart, and a slow one (issue 69)
    assert options.outage_end(100.0) == 100.0 + options.max_outage
    assert ConnectOptions(max_outage=None).outage_end(100.0) is None  # for ever
    top = SimpleNamespace(uniform=lambda low, high: high)
    pauses = ConnectOptions(retries=2, backoff=(0.1, 0.5)).pauses(top, forever=True)
    assert [next(pauses) for _ in range(12)] == [0.0, 0.1, 0.2, 0.4] + [0.5] * 8  # past ``retries``: as many as asked


def test_the_connect_limit_is_connect_timeout_else_timeout_else_10_seconds():
    assert ConnectOptions().connect_limit == 10.0
    assert ConnectOptions(timeout=2).connect_limit == 2
    assert ConnectOptions(timeout=2, connect_timeout=0.5).connect_limit == 0.5


def test_a_reply_may_take_the_timeout_plus_what_the_request_asks_the_server_to_wait():
    assert ConnectOptions().reply_limit(MsgType.CONSUME, {"wait_ms": 5000}) is None
    options = ConnectOptions(timeout=2)
    assert options.reply_limit(MsgType.PING, None) == 2
    assert options.reply_limit(MsgType.CONSUME, {"queue": "q", "wait_ms": 5000}) == 7
    assert options.reply_limit(MsgType.REQUEST, {"queue": "q", "timeout_ms": 1500}) == 3.5
    assert options.reply_limit(MsgType.REQUEST, {"queue": "q"}) is None  # a request that waits for ever
