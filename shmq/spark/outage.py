"""Riding out a restart of the server that a query reads or writes over ``url``
(docs/SPARK.md, "When the server restarts").

Strategy: every call a part of the query (the source's driver and tasks, the sink's tasks
and commit, the JVM sink's publisher) makes to the server over TCP goes through
``ride_out``. While the call raises BrokerUnavailable (the server cannot be reached:
refused, reset, closed, no reply; or it refused for a limit, LimitExceeded: "the server is
stopping", "too many connections", which every client a restart dropped meets at once, and
nothing was done), it is made again: at once the first time (a connection
the server closed while idle, or a client's own reconnect that just gave up), then after
pauses drawn between 0 and a bound that doubles from ``RECONNECT_PAUSES_S[0]`` to at most
``[1]`` seconds (full jitter, as the Python clients' reconnect), until the query's
``maxOutage`` (by default the clients' ``max_outage``) has passed since the first failure;
then the last error, saying so. Nothing else is tried again: a refused
token, a certificate the client does not trust, a missing stream fail at once. Only calls
that may run twice go through it: reads and checks, a stream created with exist_ok, a
publish (once per query and batch), a staging append (one made twice leaves records that
no staged range names: the commit publishes the ranges the task returned, and deletes
the staging stream with the rest), a queue put (at least once anyway). Each process logs
one warning per outage of a server, when the try made at once has failed too, and none
per try.
"""

import logging
import random
import ssl
import time

from ..client.options import split_url
from ..errors import BrokerUnavailable, LimitExceeded
from .options import RECONNECT_PAUSES_S

__all__ = ["ride_out", "pauses"]

log = logging.getLogger("shmq.spark")

_out = set()  # the servers (urls without a token) this process found unreachable, until one answers again
_sleep = time.sleep  # (the tests' fake clock replaces both)
_clock = time.monotonic


def pauses(rng=random):
    """The pauses between the tries after the first failure: none before the first try
    again, then the n-th (from 0) drawn between 0 and min(RECONNECT_PAUSES_S[1],
    RECONNECT_PAUSES_S[0] * 2**n), as ``ConnectOptions.pauses`` draws them (tasks a restart
    dropped together do not knock again together)."""
    first, most = RECONNECT_PAUSES_S
    yield 0.0
    n = 0
    while True:
        yield rng.uniform(0, min(most, first * 2 ** min(n, 64)))
        n += 1


def _unreachable(e: BrokerUnavailable | LimitExceeded) -> bool:
    """Whether ``e`` says the server could not be reached, or refused for a limit (worth trying
    again), not that its certificate is not trusted (the same next time)."""
    return not isinstance(e.__context__, ssl.SSLCertVerificationError)


def ride_out(opts, who: str, call, reset=None):
    """``call()``, made again while the server of ``opts.url`` cannot be reached, for at most
    ``opts.max_outage`` seconds from its first failure (see the module); ``reset()``
    after each failure (to drop a broken handle). ``who`` names the part in the log line
    ("source (the driver)"). Without ``url`` (a local namespace), just ``call()``."""
    if opts.url is None:
        return call()
    url = split_url(opts.url).url
    tries, started, error = 0, None, None
    waits = pauses()
    while True:
        try:
            out = call()
        except (BrokerUnavailable, LimitExceeded) as e:
            if not _unreachable(e):
                raise
            error = e
            if reset is not None:
                reset()
        else:
            if tries:
                _out.discard(url)
            return out
        now = _clock()
        tries += 1
        if started is None:
            started = now
        spent = now - started
        if tries > 1 and spent >= opts.max_outage:
            if not opts.max_outage:
                raise error
            raise BrokerUnavailable(f"{error} (the shmq {who} tried {tries} times in {spent:.0f}s: "
                                    f"option maxOutage is {opts.max_outage:g}s)") from error
        if tries == 2 and url not in _out:
            _out.add(url)
            log.warning("shmq %s: the server at %s cannot be reached (%s); trying again for up to %gs (option "
                        "maxOutage)", who, url, error, opts.max_outage)
        pause = next(waits)
        if pause:
            _sleep(min(pause, max(0.0, started + opts.max_outage - now)))
