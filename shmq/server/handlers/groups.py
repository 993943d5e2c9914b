"""A stream's consumer groups: JOIN, POLL (of one member or several), COMMIT, SEEK,
PAUSE, LEAVE, ASSIGNMENT, and GROUPS, COMMITTED, LAG and RESET."""

from ...errors import StreamNotFound
from ...protocol.frames import describe
from ...protocol.payloads import from_pairs, pairs, record_reply
from ..anyline import AnyLine
from .answers import RECORD_OVERHEAD, reply_budget, wait_or_answer
from .streams import fill, record_bytes


def join(conn, f):
    s = conn.server.stream(f["stream"])  # StreamNotFound before anything is made
    options = {}
    if "max_poll_interval_ms" in f:
        options["max_poll_interval"] = f["max_poll_interval_ms"] / 1000 or None
    tag, c = conn.members.join(conn.server.broker, s.name, f["group"], f["auto_offset_reset"], **options)
    conn.server.streams.notify(s.name)  # the group's waiting POLLs rebalance
    return {"member": tag, "partitions": c.assignment()}


def _poll(args):
    """A POLL's records, or the assignment's changes its member found: never both. The
    changes are looked for once, before anything is read, and the reads that fill the
    reply (in rounds) take no view of their own; else a rebalance found between two
    rounds would tell the client a partition's revocation, at a position past records of
    it that the same reply carries, before the client had them: its on_revoke's commit
    (or auto-commit's) would store that position, and a crash before it handled them
    would lose them."""
    c, *limits = args
    if c.look() or c.told != ({}, []):
        return []  # the assignment's changes are answered at once
    got = fill(lambda n, got: c.read_on(n), *limits)
    return got or None


def _poll_reply(conn, args, rs):
    """A POLL's records, and the assignment's changes its member found (``HeldConsumer``)."""
    return {"records": [record_reply(r) for r in rs], **args[0].take_told()}


def poll(conn, f):
    s = conn.server.stream(f["stream"])
    c = conn.members.get(s.name, f["member"])
    c.polling(f["wait_ms"] / 1000)  # max_poll_interval counts from the end of the wait
    args = (c, f["max"], reply_budget(conn.server, 0), s.max_message_bytes + RECORD_OVERHEAD)
    return wait_or_answer(conn, f, conn.server.streams.line_of, s, _poll, _poll_reply, args)


def poll_many(conn, f):
    """One POLL of several members of this connection (a consumer of several streams),
    in the order named; it waits in all their streams' lines at once (``AnyLine``)."""
    members = [conn.members.get(name, tag) for name, tag in f["members"]]
    for c in members:
        c.polling(f["wait_ms"] / 1000)
    args = (members, f["max"], reply_budget(conn.server, 0))
    return wait_or_answer(conn, f, lambda _: _any_line(conn, members), None, _poll_many, _poll_many_reply, args)


def _any_line(conn, members):
    streams = conn.server.streams
    return AnyLine(conn.server.loop, [streams.line_of(conn.server.stream(c.stream.name)) for c in members])


def _poll_many(args):
    """Each member's records (None: its stream is gone), the most and the reply's budget
    shared in order; None when none has records, changes to tell, or is gone. As a
    POLL's (``_poll``): every member's changes are looked for first, and a reply that
    tells some carries no records, of any member (the client calls on_revoke once for
    them all, and a commit there covers every stream's positions)."""
    members, left, budget = args
    polls, moved = [None] * len(members), False
    for k, c in enumerate(members):
        try:
            moved = c.look() or c.told != ({}, []) or moved
            polls[k] = []
        except StreamNotFound:
            moved = True
    if moved:
        return polls
    answer = False
    for k, c in enumerate(members):
        per_record = c.stream.max_message_bytes + RECORD_OVERHEAD
        try:
            got = []
            if left and (not answer or budget >= per_record):  # only the first record may overrun the frame
                got = fill(lambda n, got: c.read_on(n), left, budget, per_record)
        except StreamNotFound:
            polls[k] = None
            answer = True
            continue
        polls[k] = got
        left -= len(got)
        budget -= sum(map(record_bytes, got))
        answer = answer or bool(got)
    return polls if answer else None


def _poll_many_reply(conn, args, polls):
    members = args[0]
    out = []
    for c, got in zip(members, polls or [()] * len(members)):
        if got is None:
            out.append({"records": [], "gone": True, "revoked": pairs(c.positions())})
        else:
            out.append({"records": [record_reply(r) for r in got], **c.take_told()})
    return {"polls": out}


def commit(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    c.commit_for_client(from_pairs(f["offsets"]) if "offsets" in f else None, f["revoked"])
    return {}


def seek(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    to, ps = f.get("to"), f["partitions"]
    if "offset" in f and len(ps) == 1:
        c.seek(ps[0], f["offset"])
    elif to in ("beginning", "end") and "offset" not in f:
        (c.seek_to_beginning if to == "beginning" else c.seek_to_end)(*ps)
    else:
        got = f"partitions [{', '.join(map(str, ps))}], offset {describe(f.get('offset'))}, to {describe(to)}"
        raise ValueError(f"a SEEK takes one partition and an offset, or partitions and to: \"beginning\" or \"end\", "
                         f"not {got}")
    return {}


def pause(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    if f.get("paused") is not None:
        (c.pause if f["paused"] else c.resume)(*f["partitions"])
    return {"paused": c.paused()}


def leave(conn, f):
    conn.members.leave(f["stream"], f["member"])
    conn.server.streams.notify(f["stream"])
    return {}


def assignment(conn, f):
    c = conn.members.get(f["stream"], f["member"])
    owned = c.assignment()
    return {"partitions": owned, "positions": pairs({p: c.position(p) for p in owned})}


def groups(conn, f):
    return {"groups": conn.server.stream(f["stream"]).groups()}


def committed(conn, f):
    return {"committed": pairs(conn.server.stream(f["stream"]).committed(f["group"]))}


def lag(conn, f):
    return {"lag": pairs(conn.server.stream(f["stream"]).lag(f["group"]))}


def reset(conn, f):
    to = from_pairs(f["offsets"]) if "offsets" in f else f.get("to", "earliest")
    conn.server.stream(f["stream"]).reset(f["group"], to=to)
    return {}
