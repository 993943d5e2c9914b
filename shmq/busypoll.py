"""Busy polling: a short spin before a sleep on a socket, for the server's loop and for
both TCP clients.

Strategy: on a virtual machine, waking a process asleep on another CPU costs some 20 µs
(the sleeping virtual CPU is halted: its wake is an interrupt through the host), more
than a request's whole processing. A side that expects bytes soon therefore looks for
them without sleeping for a short window first: the server's loop after each read (the
client's next request follows its reply), a client after each request (its reply
follows). Measured on the 2-CPU machine of the benches (``python -m bench.loopback``):
one round trip 54 µs with both sides asleep, 20-22 µs with one spinning, 8 µs with both.

Three guards keep the spin's cost small. Each pause between looks is a ``sched_yield``:
another process that wants the CPU gets it, and a yield that took long says one did
(the CPU is contended), which ends the spin at once. A yield that took a scheduler's
slice (``_PREEMPTED_S``: a CPU-bound process ran meanwhile, the host is loaded) turns
spinning off for a pause, 50 ms, doubled up to 5 s while the next spin is preempted
again soon after it (a rare long yield on a quiet host costs one pause of 50 ms). On a
loaded host a spinner's CPU time counts against it: Linux's scheduler (EEVDF) no longer
runs it at once when its bytes come, and each request waited a whole slice (``python
-m bench.tcp --load 2``: a ping-pong's p50 4 ms spinning, 0.2 ms asleep). And the
window adapts much as Linux's haltpoll does: halved after a spin that caught nothing
(down to ``most / 32``), whole again once a sleep proved shorter than ``most``; so a
side whose peer answers late (an idle consumer, a client that thinks between requests)
soon spins only microseconds. An idle server spins not at all: only a read starts a spin.
Nor does a crowded one: a spin pays only where a CPU would otherwise idle, and with more
clients sending requests than twice the host's CPUs (``LoopSpin``'s ``most_peers``,
counted over ``CROWD_EPOCH_S``; a client waits for its replies about half the time) the
clients want every CPU between their replies (four producers and four consumers on two
CPUs, ``python -m bench.tcp --cases msg --pairs 4``: the server's spin cost more than
it saved; a ping-pong's four connections still gain from it).
"""

import os
import time

__all__ = ["Window", "LoopSpin", "spin_until_readable", "DEFAULT_BUSY_POLL_US", "MAX_BUSY_POLL_US",
           "check_busy_poll_us"]

DEFAULT_BUSY_POLL_US = 100  # the longest spin, server and clients alike (0: never spin)
MAX_BUSY_POLL_US = 10_000
_CONTENDED_S = 20e-6  # a yield that took this long: another process ran, the CPU is wanted
_PREEMPTED_S = 500e-6  # one that took this long: a CPU-bound one ran a slice; spinning pauses
PAUSE_FIRST_S, PAUSE_MOST_S = 0.05, 5.0  # the pause, doubled while preemptions recur
CROWD_EPOCH_S = 0.01  # a server counts the clients that sent it a request over this long (``LoopSpin``)

_clock = time.perf_counter
_yield = os.sched_yield


def check_busy_poll_us(value, name="busy_poll_us") -> int:
    """``value`` if it is a whole number of microseconds in 0..MAX_BUSY_POLL_US; else ValueError."""
    if type(value) is not int or not 0 <= value <= MAX_BUSY_POLL_US:
        raise ValueError(f"{name} must be an int of microseconds from 0 to {MAX_BUSY_POLL_US}, not {value!r}")
    return value


class Window:
    """How long the next spin may last (``now``, seconds), between ``most`` and
    ``most / 32``: halved by a spin that caught nothing (``missed``); back to ``most``
    when what it waited for came within ``most`` after all (``came``: a longer spin
    would have caught it), as Linux's haltpoll grows its poll after a short sleep. No
    spin at all before ``off_until`` (``preempted``: the host is loaded)."""

    __slots__ = ("most", "least", "now", "missed_at", "off_until", "pause")

    def __init__(self, most_us: int):
        self.most = check_busy_poll_us(most_us) / 1e6
        self.least = self.most / 32
        self.now = self.most
        self.missed_at = None  # when the last spin began, if it caught nothing (``came`` looks)
        self.off_until = 0.0  # (``_clock``) no spin before this: the last pause's end
        self.pause = PAUSE_FIRST_S  # the last pause's length

    def preempted(self, now: float) -> None:
        """A yield gave the CPU away for a slice (at ``now``): no spin for a pause, twice
        the last (up to ``PAUSE_MOST_S``) when this came within the last's length after
        it ended, else ``PAUSE_FIRST_S``."""
        if now - self.off_until > self.pause:
            self.pause = PAUSE_FIRST_S  # the first in a while
        else:
            self.pause = min(self.pause * 2, PAUSE_MOST_S)
        self.off_until = now + self.pause

    def missed(self, began: float) -> None:
        self.now = max(self.least, self.now / 2)
        self.missed_at = began

    def came(self) -> None:
        """What a spin that missed waited for has come (now)."""
        if self.missed_at is not None:
            if _clock() - self.missed_at < self.most:
                self.now = self.most
            self.missed_at = None


def spin_until_readable(poller, window: Window) -> bool:
    """Look at ``poller`` (a ``select.poll`` with the socket registered for POLLIN) without
    sleeping until it is readable, for ``window.now`` at most; True if it is (the caller's
    read will not sleep). False: the window passed (the caller calls ``window.came()``
    once its read returns), or the CPU is wanted; sleep on it."""
    if not window.most:
        return False
    began = _clock()
    if began < window.off_until:
        return False
    poll = poller.poll
    end = began + window.now
    while not poll(0):
        t = _clock()
        if t > end:
            window.missed(began)
            return False
        _yield()
        took = _clock() - t
        if took > _CONTENDED_S:
            if took > _PREEMPTED_S:
                window.preempted(t + took)
            return False
    return True


class LoopSpin:
    """Keeps an asyncio loop looking at its sockets without sleeping for a window after
    each ``touch`` (a read on the server, a request sent by a client): a callback due at
    every turn makes the loop's poll take no timeout. The window starts when the loop
    is through with what the touch brought (the first turn of the spin). ``wanted``
    (optional): the spin ends as soon as it says False (a client with no reply to wait
    for: what it spun for came). ``most_peers`` (a server's: twice the host's CPUs): no spin
    while more peers than that touched it in this epoch of ``CROWD_EPOCH_S`` or the one
    before (``crowded``)."""

    __slots__ = ("loop", "window", "wanted", "began", "until", "running", "most_peers", "epoch", "epoch_end",
                 "peers", "crowded_before")
    contended_s = _CONTENDED_S  # a yield longer than this ends the spin
    preempted_s = _PREEMPTED_S  # and one longer than this pauses spinning (``Window.preempted``)

    def __init__(self, loop, most_us: int, wanted=None, most_peers=None):
        self.loop = loop
        self.window = Window(most_us)
        self.wanted = wanted
        self.began = 0.0
        self.until = None  # None: the window starts at the spin's next turn
        self.running = False  # a spin is under way (its callback is due)
        self.most_peers = most_peers  # None: peers are not counted
        self.epoch = 0  # the count's epoch: a peer counted in it carries its number (``crowded``)
        self.epoch_end = 0.0
        self.peers = 0  # the peers that touched it in this epoch
        self.crowded_before = False  # more than most_peers did in the epoch before

    def crowded(self, peer, now: float) -> bool:
        """Count ``peer`` (an object with a ``spin_epoch`` attribute) among this epoch's,
        at ``now`` (any monotonic clock's seconds, the same each call): True while more
        than ``most_peers`` touched it in this epoch or the one before."""
        if now >= self.epoch_end:  # a new epoch (the last one counts only if it has just ended)
            self.crowded_before = self.peers > self.most_peers and now < self.epoch_end + CROWD_EPOCH_S
            self.epoch += 1
            self.peers = 0
            self.epoch_end = now + CROWD_EPOCH_S
        if peer.spin_epoch != self.epoch:
            peer.spin_epoch = self.epoch
            self.peers += 1
        return self.crowded_before or self.peers > self.most_peers

    def touch(self, peer=None, now: float = 0.0) -> None:
        """Activity (from ``peer`` at ``now``, where peers are counted: ``crowded``): spin
        once the loop is through with it, for the window."""
        window = self.window
        if not window.most:
            return
        if self.most_peers is not None and peer is not None and self.crowded(peer, now):
            return  # the clients want the CPUs: no spin
        self.until = None
        if not self.running:
            if window.off_until and _clock() < window.off_until:
                return  # (the host is loaded: no spin for now)
            self.running = True
            window.came()  # (a spin that missed: did this come soon after all?)
            self.loop.call_soon(self._spin)

    def _spin(self) -> None:
        t = _clock()
        until = self.until
        if until is None:
            self.began = t
            until = self.until = t + self.window.now
        if self.wanted is not None and not self.wanted():
            pass  # what it spun for came
        elif t < until:
            _yield()
            took = _clock() - t
            if took <= self.contended_s:
                self.loop.call_soon(self._spin)
                return
            if took > self.preempted_s:
                self.window.preempted(t + took)
            # the CPU is wanted: the spin ends, its window as it was
        else:
            self.window.missed(self.began)
        self.running = False
