"""A stream's consumer groups: JOIN, POLL (of one member or several), COMMIT, SEEK,
PAUSE, LEAVE, ASSIGNMENT, and GROUPS, COMMITTED, LAG and RESET."""

from ...errors import StreamNotFound
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
    c, *limits = args
    got = fill(lambda n, got: c.poll(max_records=n, timeout=0), *limits)
    return got if got or c.told != ({}, []) else None  # the assignment's changes are answered at once


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
    shared in order; None when none has records, changes to tell, or is gone."""
    members, left, budget = args
    polls, answer = [], False
    for c in members:
        per_record = c.stream.max_message_bytes + RECORD_OVERHEAD
        try:
            got = []
            if left and (not answer or budget >= per_record):  # only the first record may overrun the frame
                got = fill(lambda n, got: c.poll(max_records=n, timeout=0), left, budget, per_record)
        except StreamNotFound:
            polls.append(None)
            answer = True
            continue
        polls.append(got)
        left -= len(got)
        budget -= sum(map(record_bytes, got))
        answer = answer or bool(got) or c.told != ({}, [])
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
        raise ValueError(f"a SEEK takes one partition and an offset, or partitions and to: 'beginning' or 'end', "
                         f"not {ps!r}, {f.get('offset')!r}, {to!r}")
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
