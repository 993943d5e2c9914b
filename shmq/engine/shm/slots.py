"""A segment's process table: each process's row (its identity, its sleepers, its shares of
the totals, its consumers), claimed, summed and forgotten here.

Strategy: a process takes a row the first time it needs one (``claim``, under the owner's
lock), and keeps it until it dies: a row is forgotten only once its process is gone
(``forget``, by whoever finds it dead), when what it counted in the owner's words (its
sleepers, its bells) is taken out of them and its shares of the totals are folded into
them, so nothing a dead process counted is lost or counted twice. A queue's rows and a
lane's are the same table (``layout.PROC``).
"""

from . import layout as L

__all__ = ["claim", "total", "forget"]

_ROW = L.PROC_SIZE
_STRIDE = L.PROC_SIZE >> 3


def claim(mm, nslots, pid, start) -> int:
    """The row of the process (``pid``, ``start``), claimed from the first free one when it
    has none; -1 when every row is taken. Lock held."""
    free = -1
    for i in range(nslots):
        p, s = L.PROC.unpack_from(mm, L.PROCS_OFF + i * _ROW)[:2]
        if p == pid and s == start:
            return i
        if p == 0 and free < 0:
            free = i
    if free >= 0:
        L.PROC.pack_into(mm, L.PROCS_OFF + free * _ROW, pid, start, 0, 0, 0, 0, 0, 0)
    return free


def total(mq, nslots, field) -> int:
    """The sum of word ``field`` (``layout.P_*``) over the rows."""
    first = L.proc_word(0, field)
    return sum(mq[first:first + nslots * _STRIDE:_STRIDE])


def forget(mq, mm, i, pid, start) -> int | None:
    """Forget row ``i`` of (``pid``, ``start``), a process that died: its sleepers and bells
    taken out of the owner's counts (a laned queue's sleepers too, in its lane 0:
    ``lanes.py``), its shares of the totals folded into them, the row freed. Returns how
    many consumers it had registered (``lifetime.py``), or None when the row is another
    process's now (reused meanwhile). Lock held."""
    p, s, cw, pw, acked, redelivered, bells, consumers = L.PROC.unpack_from(mm, L.PROCS_OFF + i * _ROW)
    if (p, s) != (pid, start):
        return None
    mq[L.I_CWAIT] -= cw
    mq[L.I_PWAIT] -= pw
    mq[L.I_BELLS] -= bells
    mq[L.I_LANE_SLEEPERS] = mq[L.I_CWAIT]
    mq[L.I_ACKED_TOTAL] += acked  # its share of the totals stays counted
    mq[L.I_REDELIVERED_TOTAL] += redelivered
    L.PROC.pack_into(mm, L.PROCS_OFF + i * _ROW, 0, 0, 0, 0, 0, 0, 0, 0)
    return consumers
