"""A stream group storm over both transports (issue 69, item 8): appenders, group
members in their own processes (local, and over TCP through a ``shmq server`` that is
SIGKILLed and started again on its port), each member of one of three kinds — polls and
commits; the same with on_revoke committing (Kafka's pattern); iterates (``for record in
consumer``) and asks its ``assignment()`` now and then, on_revoke committing — are
SIGKILLed and started again at random. Each member logs what it was handed and each
commit it tries, as tests/_workers.storm_member does; ``check`` then holds the group to
at-least-once: every offset below the end was handed to a member before a commit of
that member which succeeded and moved the group past it, so that what a member polled
and could not commit (CommitFailed) is read again by the partition's next owner; and
every record appended is committed at the end. The stream's ``max_message_bytes`` (4
MiB) makes the server read a POLL's reply in rounds of 3 records, each a chance to meet
a rebalance (how the TCP case of the issue came about).

Before the fix, 30 s of it found the iteration's hole (a local member), and 90 s with
the server's kills the POLL reply's (both of two runs); ``run(seconds, ...)`` is the
storm (``tests/test_stream_group_redelivery.py`` runs a short one, marked slow, without
the server's kills: each restart takes seconds here); ``python -m tests._group_storm
[SECONDS] [SEED] [LOG_DIR]`` a long one, printing its counts (the logs stay in LOG_DIR,
default a new temporary folder)."""

import os
import random
import signal
import sys
import threading
import time
import uuid
from pathlib import Path


import shmq
from tests import _workers as w
from tests._processes import WORKERS

PARTITIONS = 4
KINDS = ("poll", "revoke", "iter")
RECONNECT = {"retries": 60, "backoff": (0.02, 0.3)}


def _log(f, line):
    f.write(line + "\n")


def storm_appender(ns, tag, log_path, stop_event, pause):
    """tests/_workers.storm_appender, pausing up to ``pause`` seconds between batches."""
    rnd = random.Random(os.getpid())
    s = shmq.connect(namespace=ns).stream("events")
    with open(log_path, "a", buffering=1) as log:
        seq = 0
        while not stop_event.is_set():
            values = [b"%s:%d" % (tag.encode(), seq + i) for i in range(rnd.randint(1, 20))]
            ms = s.append_many(values)
            log.write("".join(f"{m.partition} {m.offset} {v.decode()}\n" for v, m in zip(values, ms)))
            seq += len(values)
            time.sleep(rnd.uniform(0, pause))  # pacing, so the members keep up on a small machine


def storm_member(ns, url, kind, log_path, stop_event):
    """A member of group "g" of stream "events", local (``url`` None) or over TCP, of
    ``kind``, until stopped or killed. Its log: ``j`` a join, ``d t0 t1 p first last`` a
    run of records it was handed, ``t t0 p:committed-before:offset ...`` a commit about to
    be tried (explicit offsets: the positions ``position`` gave), then ``ok t1``, ``fail
    t1`` (CommitFailed) or ``maybe t1`` (the connection was lost: it may have landed);
    ``l`` a leave. Over TCP it comes back by itself after the server's restart."""
    sys.stderr = open(log_path + ".err", "a", buffering=1)  # why it ended, if it did by itself
    rnd = random.Random(os.getpid())
    local = shmq.connect(namespace=ns).stream("events")  # (the group's committed offsets, for the log)
    broker = None
    while url and broker is None and not stop_event.is_set():
        try:
            broker = shmq.connect(url, **RECONNECT)
        except shmq.BrokerUnavailable:
            time.sleep(0.05)  # started while the server is away
    if url and broker is None:
        return
    s = broker.stream("events") if broker else local
    now = time.monotonic_ns
    log = open(log_path, "a", buffering=1)
    state = {"c": None}

    def commit():
        c = state["c"]
        if state.get("committing"):  # on_revoke, called inside a call of this commit (a rejoin after a reconnect)
            return
        state["committing"] = True
        try:
            _commit(c)
        finally:
            state["committing"] = False

    def _commit(c):
        mine = {}
        for p in range(PARTITIONS):
            try:
                mine[p] = c.position(p)
            except KeyError:
                pass
        if not mine:
            return
        before = local.committed("g")
        _log(log, "t %d %s" % (now(), " ".join(f"{p}:{before.get(p, -1)}:{o}" for p, o in mine.items())))
        try:
            c.commit(mine)
            _log(log, f"ok {now()}")
        except shmq.CommitFailed:
            _log(log, f"fail {now()}")
        except shmq.BrokerUnavailable:
            _log(log, f"maybe {now()}")

    def on_revoke(partitions):
        commit()  # what it was handed, the revoked partitions' too (Kafka's pattern)

    def handed(records, t0):
        runs = {}
        for r in records:
            first, last = runs.setdefault(r.partition, [r.offset, r.offset - 1])
            assert r.offset == last + 1, "handed out in order"
            runs[r.partition][1] = r.offset
        log.write("".join(f"d {t0} {now()} {p} {a} {b}\n" for p, (a, b) in runs.items()))

    slow = rnd.choice([0.1, 0.5])
    while not stop_event.is_set():
        try:
            if state["c"] is None:
                state["c"] = s.consumer("g", **({} if kind == "poll" else {"on_revoke": on_revoke}))
                _log(log, "j")
            c = state["c"]
            t0 = now()
            if kind == "iter":
                # as ``for record in c`` takes them: a batch of up to 500 held (``_buffer``), handed
                # out a few at a time (a bounded wait here, where the iteration's would not end)
                if not c._buffer:
                    c._buffer.extend(c.poll(max_records=500, timeout=0.05))
                got = c.poll(max_records=rnd.choice([1, 1, 5, 30]), timeout=0) if c._buffer else []
                handed(got, t0)
                if rnd.random() < 0.1:
                    c.assignment()  # a new view while the iteration holds records
            else:
                handed(c.poll(max_records=rnd.choice([1, 5, 30, 200]), timeout=0.05), t0)
            if rnd.random() < slow:
                time.sleep(rnd.uniform(0, 0.2))  # handling them: the group may move meanwhile
            if rnd.random() < 0.6:
                commit()
            if rnd.random() < 0.03:
                c.close()
                state["c"] = None
                _log(log, "l")
                time.sleep(rnd.uniform(0, 0.2))  # away a while: the others take its partitions
        except shmq.BrokerUnavailable:
            time.sleep(0.05)  # the server is away: the next call connects again
    if state["c"] is not None:
        try:
            state["c"].close()
        except shmq.BrokerUnavailable:
            pass


class Storm:
    """The processes of one storm in namespace ``ns``, their logs in ``logs``."""

    def __init__(self, ns, logs: Path, seed, tcp=True, pause=0.02, max_message_bytes=4 << 20):
        self.ns, self.logs, self.rnd, self.pause = ns, logs, random.Random(seed), pause
        self.broker = shmq.connect(namespace=ns)
        self.broker.create_namespace()
        # (records of 10-odd bytes; the bound is what the server sizes a POLL's reading rounds by:
        # 4 MiB in 16 MiB frames makes them 3 records, each round a chance to meet a rebalance)
        self.s = self.broker.create_stream("events", partitions=PARTITIONS, max_bytes=8 << 20, durability="memory",
                                           max_message_bytes=max_message_bytes)
        self.stop_appending, self.stop_members = w.StopFlag(WORKERS), w.StopFlag(WORKERS)
        self.procs, self.counter, self.kills, self.server_kills = {}, 0, 0, 0
        self.crashed = []  # (tag, exit code) of the processes that ended before they were killed
        self.server, self.port, self.restarting = None, None, None
        if tcp:
            from tests.test_client_resume import free_port
            self.port = free_port()
            self.start_server()

    @property
    def url(self):
        return None if self.server is None else f"tcp://127.0.0.1:{self.port}"

    def start_server(self):
        from tests.test_server_tcp import ServerProcess
        self.server = ServerProcess(self.ns, "--port", str(self.port), "--no-persist")

    def kill_server(self):
        """SIGKILL the server, and start it again on its port in a thread (its start-up takes
        seconds on a loaded machine; the storm goes on meanwhile, its TCP members reconnecting)."""
        self.restarted()
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.stop()
        self.server_kills += 1
        self.restarting = threading.Thread(target=self.start_server)
        self.restarting.start()

    def restarted(self):
        """Wait for a restart under way to be done."""
        if self.restarting is not None:
            self.restarting.join(60)
            assert not self.restarting.is_alive(), "the server did not start again"
            self.restarting = None

    def start(self, what):
        """``what``: "a" (an appender), or (transport, kind) of a member."""
        self.counter += 1
        if what == "a":
            tag = f"a{self.counter}"
            target, args = storm_appender, (self.ns, tag, str(self.logs / tag), self.stop_appending, self.pause)
        else:
            transport, kind = what
            tag = f"m{self.counter}-{transport}-{kind}"
            url = self.url if transport == "tcp" else None
            target, args = storm_member, (self.ns, url, kind, str(self.logs / tag), self.stop_members)
        self.procs[tag] = (what, WORKERS.Process(target=target, args=args))
        self.procs[tag][1].start()

    def kill(self, tag):
        what, p = self.procs.pop(tag)
        if p.exitcode is not None:  # it ended by itself: a failure, said at the end
            self.crashed.append((tag, p.exitcode))
        else:
            os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        self.kills += 1
        return what

    def storm(self, seconds, pace=(0.1, 0.6), server_every=6.0):
        transports = ["local", "tcp"] if self.server else ["local"]
        for what in ["a", "a"] + [(t, k) for t in transports for k in KINDS]:
            self.start(what)
        # the clock starts once every process runs: appends in every partition, every member joined
        until = time.monotonic() + 120
        while not (all(self.s.offsets(p)[1] for p in range(PARTITIONS))
                   and all((self.logs / tag).exists() for tag in self.procs if tag[0] == "m")):
            assert time.monotonic() < until, "the storm's processes did not start"
            time.sleep(0.05)  # polling a real condition, with a bound
        t_end = time.monotonic() + seconds
        next_server = time.monotonic() + (server_every or 0)
        while time.monotonic() < t_end:
            time.sleep(self.rnd.uniform(*pace))  # the kill instant is random on purpose; nothing waits on it
            if self.server and server_every and time.monotonic() >= next_server and (
                    self.restarting is None or not self.restarting.is_alive()):
                self.kill_server()
                next_server = time.monotonic() + server_every
                continue
            kind = "a" if self.rnd.random() < 0.1 else "m"
            tag = self.rnd.choice(sorted(t for t in self.procs if t[0] == kind))
            self.start(self.kill(tag))

    def finish(self, timeout=120):
        """Appenders stopped, then the members run until the group committed every record."""
        self.restarted()
        self.stop_appending.set()
        for tag in [t for t in self.procs if t[0] == "a"]:
            _what, p = self.procs.pop(tag)
            p.join(30)
            assert p.exitcode == 0, (tag, p.exitcode)
        ends = {p: self.s.offsets(p)[1] for p in range(PARTITIONS)}
        until = time.monotonic() + timeout
        while self.s.committed("g") != ends:
            assert time.monotonic() < until, f"the group did not commit everything: {self.s.committed('g')} {ends}"
            time.sleep(0.05)  # polling a real condition, with a bound
        self.stop_members.set()
        for tag, (_what, p) in list(self.procs.items()):
            p.join(30)
            assert p.exitcode == 0, (tag, p.exitcode)
            self.procs.pop(tag)
        return ends

    def close(self):
        self.stop_appending.set()
        self.stop_members.set()
        if self.restarting is not None:
            self.restarting.join(60)
        for _what, p in self.procs.values():
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
                p.join(10)
        if self.server is not None and self.server.proc.poll() is None:
            self.server.proc.send_signal(signal.SIGKILL)
            self.server.stop()
        try:
            self.broker.delete_stream("events")
        except shmq.StreamNotFound:
            pass
        self.broker.close()


def check(logs: Path, s, ends) -> dict:
    """At-least-once, from the logs: every offset below the end (all committed at the end)
    was handed to a member before a commit of that member that succeeded (or may have:
    cut off before it said) and moved the group past it. A record a member polled and
    could not commit is covered only by another member that was handed it again, or by
    a later commit of its own; one committed past by nobody who had it is a hole. Also
    every append that returned is in the stream. Returns the counts, and ``strict``: the
    successful commits past records their member was not handed in its stint on the
    partition (tests/engine/test_groups.py's stronger accounting, which two lawful cases
    break: on_revoke's commit after the new owner stored the offset it found, and an
    explicit commit after a reconnect of offsets the member had before it)."""
    from tests.engine.test_groups import _covered, _LatestOther, _member_logs, _read_all

    appended = [line.split(" ") for f in logs.iterdir() if f.name[0] == "a" for line in
                f.read_text().split("\n")[:-1]]
    for p in range(PARTITIONS):
        stored = {r.offset: r.value for r in _read_all(s, p)}
        assert sorted(stored) == list(range(ends[p]))
        assert all(stored[int(o)] == v.encode() for q, o, v in appended if int(q) == p), "an append is missing"
    members = _member_logs([f for f in logs.iterdir() if f.name[0] == "m" and f.suffix != ".err"])
    latest = _LatestOther([(c[0], c[3], c[4], name) for name, _got, cs in members for c in cs
                           if c[5] == "ok" and c[1] != c[2]])  # (those that moved the offset)
    covers, strict = {p: [] for p in range(PARTITIONS)}, []
    for name, got, commits in members:
        for p, before, offset, t0, _t1, outcome, n_got in commits:
            if outcome == "fail":
                continue
            lo = max(before, 0)
            for _d0, _d1, q, a, b in got[:n_got]:  # handed before this commit
                if q == p and max(a, lo) <= min(b, offset - 1):
                    covers[p].append((max(a, lo), min(b, offset - 1)))
            other = latest.start(p, name, t0)
            stint = [(a, b) for _d0, d1, q, a, b in got[:n_got] if q == p and d1 > other]
            if outcome == "ok" and not _covered(stint, lo, offset):
                strict.append(f"{name} {p}: {before} -> {offset}")
    for p in range(PARTITIONS):
        holes = _holes(covers[p], 0, ends[p])
        assert not holes, f"partition {p}: offsets {holes} committed past, and never handed to a member that did"
    outcomes = [c[5] for _n, _g, cs in members for c in cs]
    return {"appended": len(appended), "members": len(members), "ok": outcomes.count("ok"),
            "fail": outcomes.count("fail"), "maybe": outcomes.count("maybe"), "strict": strict}


def _holes(runs, lo, hi) -> list:
    """The offset ranges [(first, last)] of [lo, hi) that the runs [(first, last)] miss."""
    out = []
    for first, last in sorted(runs):
        if first > lo:
            out.append((lo, min(first, hi) - 1))
        lo = max(lo, last + 1)
        if lo >= hi:
            break
    if lo < hi:
        out.append((lo, hi - 1))
    return [h for h in out if h[0] <= h[1]]


def run(seconds, logs: Path, seed=69, tcp=True, ns=None, server_every=6.0, pause=0.02, kill_pace=(0.1, 0.6)):
    """One storm of ``seconds`` in namespace ``ns`` (default: a new one, destroyed after),
    the server killed every ``server_every`` seconds (None: never), a member or an appender
    every ``kill_pace`` seconds (drawn between the two), appenders pausing up to ``pause``
    seconds between batches; checked; returns its counts."""
    from shmq.engine.shm.segment import destroy_namespace

    own = ns is None
    ns = ns or "t" + uuid.uuid4().hex[:12]
    storm = Storm(ns, logs, seed, tcp, pause)
    try:
        storm.storm(seconds, pace=kill_pace, server_every=server_every)
        ends = storm.finish()
        assert not storm.crashed, f"processes ended by themselves: {storm.crashed} (their LOG.err say why)"
        counts = check(logs, storm.s, ends)
        counts.update(kills=storm.kills, server_kills=storm.server_kills, records=sum(ends.values()))
        return counts
    finally:
        storm.close()
        if own:
            destroy_namespace(ns)


if __name__ == "__main__":
    import tempfile

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 90
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 69
    logs = Path(sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="group-storm-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(run(seconds, logs, seed), "logs:", logs)
