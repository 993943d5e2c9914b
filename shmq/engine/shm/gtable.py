"""A stream's group table, in its meta segment: where each group's words are (its head —
used, name, generation, last seen —, its members' slots, each partition's committed offset
and owner-since generation, each member's poll deadline) and every store into them.

Strategy: the stores a membership change makes are ordered for a holder killed between any
two (``streams/groups.py``, whose rules these keep: the generation and the owner-since
words before the member slots; a generation as two word stores, never a repacked head).
Every caller holds the stream's lock.
"""

from . import layout as L

__all__ = ["group_off", "member_off", "committed_w", "since_w", "deadline_w", "create", "free", "set_committed",
           "set_generation", "mark_since", "grown", "set_deadline", "add_member", "clear_member", "next_member_id"]

NO = L.NO_OFFSET
_GEN_OFF = L.GROUP_HEAD.size - 16  # a group head's generation, then its last-seen time: words


def group_off(i) -> int:
    return L.GROUPS_OFF + i * L.GROUP_SIZE


def member_off(i, m) -> int:
    return group_off(i) + L.GROUP_HEAD.size + m * L.MEMBER.size


def committed_w(i, p) -> int:
    return (group_off(i) + L.GROUP_COMMITTED_OFF + 8 * p) >> 3


def since_w(i, p) -> int:
    return (group_off(i) + L.GROUP_SINCE_OFF + 8 * p) >> 3


def deadline_w(i, m) -> int:
    return (group_off(i) + L.GROUP_DEADLINE_OFF + 8 * m) >> 3


def create(mm, mq, i, raw, now) -> None:
    """Slot ``i`` becomes group ``raw`` (its name's bytes), with no member, no commit."""
    L.GROUP_HEAD.pack_into(mm, group_off(i), 1, len(raw), raw, 0, now)
    for m in range(L.MAX_MEMBERS):
        L.MEMBER.pack_into(mm, member_off(i, m), 0, 0, 0)
    for p in range(L.MAX_PARTITIONS):
        mq[committed_w(i, p)] = NO
        mq[since_w(i, p)] = 0
    for m in range(L.MAX_MEMBERS):
        mq[deadline_w(i, m)] = 0


def free(mm, i, raw) -> None:
    """Slot ``i`` (group ``raw``) is free again (``create`` clears its words when taken)."""
    L.GROUP_HEAD.pack_into(mm, group_off(i), 0, len(raw), raw, 0, 0)


def set_committed(mq, i, p, offset) -> None:
    mq[committed_w(i, p)] = offset


def set_generation(mq, i, gen, seen=None) -> None:
    """Two word stores, not a repacked head: ``struct.pack_into`` zeroes what it packs
    before it writes, and a kill between the two left the group's slot free."""
    w = (group_off(i) + _GEN_OFF) >> 3
    if seen is not None:
        mq[w + 1] = seen
    mq[w] = gen


def mark_since(mq, i, partitions, gen) -> None:
    """The owner of each of ``partitions`` changes in generation ``gen``."""
    for p in partitions:
        mq[since_w(i, p)] = gen


def grown(mq, i, old, new, gen) -> None:
    """The stream grew from ``old`` to ``new`` partitions: the new ones uncommitted, owned
    since the next generation, which group ``i`` (at ``gen``) moves on to."""
    for p in range(old, new):
        mq[committed_w(i, p)] = NO
        mq[since_w(i, p)] = gen + 1
    set_generation(mq, i, gen + 1)


def set_deadline(mq, i, m, deadline) -> None:
    """Member slot ``m`` is taken for gone unless it polls by ``deadline`` (monotonic ns; 0: never)."""
    mq[deadline_w(i, m)] = deadline


def add_member(mm, i, m, pid, start, member_id) -> None:
    L.MEMBER.pack_into(mm, member_off(i, m), pid, start, member_id)


def clear_member(mm, mq, i, m) -> None:
    L.MEMBER.pack_into(mm, member_off(i, m), 0, 0, 0)
    mq[deadline_w(i, m)] = 0


def next_member_id(mq) -> int:
    """A new member id, unique in the stream."""
    mq[L.SI_NEXT_MEMBER] += 1
    return mq[L.SI_NEXT_MEMBER]
