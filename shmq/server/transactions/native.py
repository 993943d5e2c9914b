"""A native group member's offsets in a transaction (``Transactions.commit_native_offsets``):
held until the transaction ends, then stored by the member's own fenced commit
(``Groups.commit``), so that a member that lost a partition since makes the transaction
abort, and never stores offsets past records nobody will see."""

import logging

from ...errors import CommitFailed, ShmqError
from .state import Txn

__all__ = ["hold", "commit", "held"]

log = logging.getLogger("shmq.server")


def hold(t: Txn, group, stream, member, generation, owned, offsets) -> None:
    """A native group member's ``offsets`` held in ``t`` (merged with those held before)."""
    held = t.native.setdefault((group, stream), [member, generation, [], {}])
    held[0], held[1], held[2] = member, generation, sorted(owned)
    held[3].update(offsets)

def commit(t: Txn, topic) -> CommitFailed | None:
    """Each native group's offsets held in ``t`` committed, fenced (``Groups.commit``), the
    streams found by ``topic(name)``; the first refusal puts back what was committed before
    it and is returned."""
    done = []
    for (group, name), (member, gen, owned, offsets) in t.native.items():
        s, _code = topic(name)
        try:
            if s is None:
                raise CommitFailed(f"stream {name!r} is gone")
            before = s.groups_table.committed(group)
            s.groups_table.commit(group, member, gen, owned, offsets)
            done.append((s, group, member, gen, owned, {p: before[p] for p in offsets if p in before}))
        except ShmqError as e:
            for s2, group2, member2, gen2, owned2, back in reversed(done):
                try:
                    s2.groups_table.commit(group2, member2, gen2, owned2, back)
                except ShmqError as again:
                    log.warning("transaction %r: the offsets of group %s in %s cannot be put back: %s", t.tid,
                                group2, s2.name, again)
            return e if isinstance(e, CommitFailed) else CommitFailed(str(e))
    return None

def held(t: Txn, topic) -> bool:
    """Whether every native group holds ``t``'s offsets as committed (an end cut short by a
    crash stored them, or not)."""
    for (group, name), (_member, _gen, _owned, offsets) in t.native.items():
        s, _code = topic(name)
        if s is None:
            return False
        committed = s.committed(group)
        if any(committed.get(p) != o for p, o in offsets.items()):
            return False
    return True
