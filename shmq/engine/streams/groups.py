"""Consumer groups of a stream: members, the partitions each owns, committed offsets.

Strategy: Kafka's group semantics without a coordinator process. The group table lives
in the stream's meta segment, under its robust mutex. A group has a generation that
moves whenever its membership does (a join, a close, a member found dead); every
member derives the same assignment from the same sorted member list (partition ``p``
goes to member ``p % n``), so no one hands partitions out and no two members of a
generation own one partition. Members are processes found dead the way lease holders
are (pid + start time); over TCP the server is the member on behalf of each connection,
so one process may hold several members.

Each membership change moves the generation by one, and where it changes a
partition's owner the table notes the new generation as that partition's *owner
since*. A member that last saw generation g and owns ``p`` again may go on from its
own position only if ``since[p] <= g``: nobody else owned ``p`` in between, even in
generations it never saw. Otherwise it starts at the committed offset (Kafka's rule).
The same test is the fence on commits: a commit names the generation of the member's
last view, and is refused (CommitFailed) for a partition the member does not own now
or has not owned without a break since then (Kafka's assignment epochs, KIP-1251), so
a stale member never moves an offset, while the owner may move it anywhere, back too.
The generation and the owner-since words are written before the member slots, so a
holder killed half way leaves at worst a mark too many (a member reads again from the
commit), never an owner change the marks miss.
"""

import time
from contextlib import contextmanager

from ...errors import CommitFailed, ShmqError
from ..shm import layout as L
from ..shm import gtable, waits
from ..shm.process import current_identity, is_alive
from ..shm.mutex import unlock as _unlock

__all__ = ["Groups", "assign", "owner", "PROXY"]

_NO = L.NO_OFFSET
# A member id with this bit is a stand-in, not a consumer: a Kafka listener holds one in
# each stream a Kafka group of the same name reads (``join_proxy``), so native consumers
# and Kafka consumers never share a group (docs/KAFKA.md, Consumer groups).
PROXY = 1 << 62
_mono = time.monotonic_ns


def owner(members, p: int) -> int:
    """The member id that owns partition ``p`` among ``members`` (ids); 0 for none."""
    ids = sorted(members)
    return ids[p % len(ids)] if ids else 0


def assign(members, partitions: int, member_id: int) -> list[int]:
    """The partitions ``member_id`` owns among ``members`` (ids): p % n == its rank."""
    ids = sorted(members)
    if member_id not in ids:
        return []
    rank, n = ids.index(member_id), len(ids)
    return [p for p in range(partitions) if p % n == rank]




class Groups:
    """The group table of one stream's meta segment. Every method takes the stream's lock."""

    def __init__(self, stream):
        self._s = stream  # the Stream handle: its meta mapping, lock and partition count

    # --------------------------------------------------------------- table access (lock held)
    def _head(self, i):
        used, n, raw, gen, seen = L.GROUP_HEAD.unpack_from(self._s._mm, self._off(i))
        return used, raw[:n].decode(), gen, seen

    def _find(self, name, create=False):
        free = None
        for i in range(L.MAX_GROUPS):
            used, n, _gen, _seen = self._head(i)
            if used and n == name:
                return i
            if not used and free is None:
                free = i
        if not create:
            return None
        if free is None:
            raise ShmqError(f"stream {self._s.name!r} has {L.MAX_GROUPS} groups already")
        gtable.create(self._s._mm, self._s._mq, free, name.encode(), _mono())
        return free

    _off, _member_off = staticmethod(gtable.group_off), staticmethod(gtable.member_off)
    _committed_w, _since_w, _deadline_w = (staticmethod(gtable.committed_w), staticmethod(gtable.since_w),
                                           staticmethod(gtable.deadline_w))

    def _set_committed(self, i, p, offset):
        gtable.set_committed(self._s._mq, i, p, offset)

    def _members(self, i):
        """[(slot, pid, start_ms, member_id)] of group ``i``."""
        out = []
        for m in range(L.MAX_MEMBERS):
            pid, start, mid = L.MEMBER.unpack_from(self._s._mm, self._member_off(i, m))
            if mid:
                out.append((m, pid, start, mid))
        return out

    def _set_generation(self, i, gen, seen=None):
        gtable.set_generation(self._s._mq, i, gen, seen)

    def _rebalance(self, i, before, after) -> int:
        """Move the generation on for a membership going from ``before`` to ``after``
        (member ids), marking the partitions whose owner changes; the caller then writes
        the member slots. Returns the new generation."""
        gen = self._head(i)[2] + 1
        self._set_generation(i, gen, _mono())
        mq = self._s._mq
        gtable.mark_since(mq, i, [p for p in range(self._s.partitions) if owner(before, p) != owner(after, p)], gen)
        # the readers waiting (a member's poll, the server's doorbell) look again now
        for _ in range(waits.owed_posts(mq, waits.READERS, 2**31)):
            self._s._ne.release()
        return gen

    def grown(self, old: int, new: int) -> None:
        """The stream grows from ``old`` to ``new`` partitions (``Stream.add_partitions``, its
        lock held): each group's generation moves on and marks the new partitions owned since
        then, uncommitted, so the members take them at their next poll; the partitions they
        own stay theirs (an owner is ``p % members``, whatever the count)."""
        mq = self._s._mq
        for i in range(L.MAX_GROUPS):
            used, _n, gen, _seen = self._head(i)
            if not used:
                continue
            gtable.grown(mq, i, old, new, gen)
        for _ in range(waits.owed_posts(mq, waits.READERS, 2**31)):
            self._s._ne.release()

    def _remove(self, i, slots) -> None:
        """Remove the members in ``slots`` (slot numbers), as one membership change."""
        members = self._members(i)
        before = [mid for _m, _p, _s, mid in members]
        self._rebalance(i, before, [mid for m, _p, _s, mid in members if m not in slots])
        for m in slots:
            gtable.clear_member(self._s._mm, self._s._mq, i, m)

    def _reap(self, i) -> bool:
        """Remove members whose process died, or who did not poll by their deadline
        (max_poll_interval); True if any was."""
        mq, now = self._s._mq, _mono()
        dead = [m for m, pid, start, _mid in self._members(i)
                if 0 < mq[self._deadline_w(i, m)] < now or not is_alive(pid, start)]
        if dead:
            self._remove(i, dead)
        return bool(dead)

    # --------------------------------------------------------------- membership
    def join(self, name: str, deadline: int = 0) -> tuple[int, int]:
        """Add this process as a member of group ``name`` (created if new), to be taken for
        gone unless it polls by ``deadline`` (monotonic ns, moved on by ``polled``; 0:
        never); returns (member id, generation)."""
        with self._joining(name) as (i, members):
            if any(mid & PROXY for _m, _p, _s, mid in members):
                raise ShmqError(f"group {name!r} of stream {self._s.name!r} has Kafka members (through shmq server's "
                                "Kafka listener): a native consumer cannot join it until they leave")
            slot, member_id, gen = self._add(i, name, members, 0)
            gtable.set_deadline(self._s._mq, i, slot, deadline)
            return member_id, gen

    def join_proxy(self, name: str) -> int:
        """Add this process (a Kafka listener) as the stand-in of a Kafka group ``name``
        (created if new), or find the one it has there; returns its member id.
        ShmqError if the group has native members: the two kinds do not mix."""
        with self._joining(name) as (i, members):
            pid, start = current_identity()
            mine = [mid for _m, p, st, mid in members if mid & PROXY and (p, st) == (pid, start)]
            if mine:
                return mine[0]
            native = [mid for _m, _p, _s, mid in members if not mid & PROXY]
            if native:
                raise ShmqError(f"group {name!r} of stream {self._s.name!r} has {len(native)} native shmq "
                                "member(s): Kafka consumers cannot join it until they close")
            return self._add(i, name, members, PROXY)[1]

    @contextmanager
    def _joining(self, name):
        """The stream's lock held: (index, live members) of group ``name`` (created if new)."""
        self._s._acquire()
        try:
            i = self._find(name, create=True)
            self._reap(i)
            yield i, self._members(i)
        finally:
            _unlock(self._s._lockp)

    def _add(self, i, name, members, kind) -> tuple[int, int, int]:
        """Put this process in a free slot of group ``i`` (its ``members`` now), the lock
        held, with the next member id marked ``kind`` (0, or PROXY); returns (slot,
        member id, the generation its coming makes). ShmqError if the group is full."""
        s = self._s
        slots = [m for m in range(L.MAX_MEMBERS)
                 if not L.MEMBER.unpack_from(s._mm, self._member_off(i, m))[2]]
        if not slots:
            raise ShmqError(f"group {name!r} of stream {s.name!r} has {L.MAX_MEMBERS} members already")
        member_id = gtable.next_member_id(s._mq) | kind
        ids = [mid for _m, _p, _s, mid in members]
        gen = self._rebalance(i, ids, ids + [member_id])
        pid, start = current_identity()
        gtable.add_member(s._mm, i, slots[0], pid, start, member_id)
        return slots[0], member_id, gen

    def leave(self, name: str, member_id: int) -> None:
        """Remove a member; its partitions go to the others at their next poll."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            if i is None:
                return
            mine = [m for m, _pid, _start, mid in self._members(i) if mid == member_id]
            if mine:
                self._remove(i, mine)
        finally:
            _unlock(s._lockp)

    def polled(self, name: str, member_id: int, deadline: int) -> bool:
        """Move a member's poll deadline (monotonic ns) on to ``deadline``; False if it is
        no longer a member."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            for m, _pid, _start, mid in self._members(i) if i is not None else ():
                if mid == member_id:
                    gtable.set_deadline(s._mq, i, m, deadline)
                    return True
            return False
        finally:
            _unlock(s._lockp)

    def generation(self, name: str) -> int:
        """The group's generation, read without the lock (a hint: it only moves forward)."""
        i = self._find(name)
        return -1 if i is None else self._head(i)[2]

    def view(self, name: str, member_id: int, reap: bool) -> tuple[int, list[int] | None, dict, dict]:
        """(generation, the member's partitions or None if it is not a member,
        committed offsets, {owned partition: the generation since which the member has
        owned it}), consistent; with ``reap``, dead members are removed first."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            if i is None:
                return -1, None, {}, {}
            if reap:
                self._reap(i)
            ids = [mid for _m, _p, _s, mid in self._members(i)]
            gen = self._head(i)[2]
            owned = assign(ids, s.partitions, member_id) if member_id in ids else None
            since = {p: s._mq[self._since_w(i, p)] for p in owned or ()}
            return gen, owned, self._committed(i), since
        finally:
            _unlock(s._lockp)

    # --------------------------------------------------------------- offsets
    def _committed(self, i) -> dict:
        mq = self._s._mq
        out = {}
        for p in range(self._s.partitions):
            off = mq[self._committed_w(i, p)]
            if off != _NO:
                out[p] = off
        return out

    def commit(self, name: str, member_id: int, generation: int, owned, offsets: dict,
               revoked: dict | None = None) -> None:
        """Store committed offsets (the next offset to read) of a member whose last view
        was ``generation``, in which it owned ``owned``: all or none, forward or back.
        CommitFailed, storing nothing, unless the member owns every partition named and
        has owned it without a break since ``generation`` (``_refusal``). ``revoked``:
        {partition it lost: the committed offset it last saw there (None: none)}, the
        commit of its on_revoke: such a partition is stored only while its committed
        offset is still that one (its new owner has committed nothing yet)."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            if i is None:
                raise CommitFailed(f"group {name!r} of stream {s.name!r} no longer exists")
            gen = self._head(i)[2]
            revoked = {p: _NO if o is None else o for p, o in (revoked or {}).items() if p in offsets}
            refusal = self._refusal(i, f"group {name!r} of stream {s.name!r}", member_id, generation, gen,
                                    set(owned), set(offsets) - set(revoked))
            moved = sorted(p for p, o in revoked.items() if s._mq[self._committed_w(i, p)] != o)
            if moved and not refusal:
                refusal = (f"group {name!r} of stream {s.name!r}: partitions {moved} were committed by their new "
                           "owner since this member let them go: nothing committed")
            if refusal:
                raise CommitFailed(refusal)
            for p, off in offsets.items():
                self._set_committed(i, p, off)
            self._set_generation(i, gen, _mono())
        finally:
            _unlock(s._lockp)

    def _refusal(self, i, where, member_id, generation, gen, owned, named) -> str | None:
        """Why a commit of the partitions ``named`` may not be stored, or None. The fence:
        a member commits a partition it owns now and has owned without a break since its
        view ``generation`` (``since[p] <= generation``: Kafka's assignment epochs,
        KIP-1251), so nobody else read or committed it meanwhile; within one generation,
        a partition it owns."""
        if gen == generation:
            foreign = sorted(named - owned)
            if not foreign:
                return None
            return f"{where}: partitions {foreign} are not this member's (it owns {sorted(owned)}): nothing committed"
        moved = f"{where} rebalanced (generation {generation} -> {gen}) since this member's last poll"
        ids = [mid for _m, _p, _s, mid in self._members(i)]
        if member_id not in ids:
            return f"{moved}, without this member (it was taken for dead): nothing committed; poll() joins again"
        now = set(assign(ids, self._s.partitions, member_id))
        lost = sorted((named & owned) - now)
        back = sorted(p for p in named & owned & now if self._s._mq[self._since_w(i, p)] > generation)
        new = sorted(named - owned)
        why = [f"partitions {lost} went to other members"] if lost else []
        why += [f"partitions {back} went to another member and came back"] if back else []
        why += [f"partitions {new} were not this member's"] if new else []
        if not why:
            return None
        return f"{moved}: {'; '.join(why)}; nothing committed: poll() takes the new assignment"

    def check(self, name: str, member_id: int, generation: int, owned, partitions) -> None:
        """CommitFailed where ``commit`` of ``partitions`` by this member would be refused
        now (a transaction's native offsets, held until it ends: ``server/transactions``);
        nothing stored."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            if i is None:
                raise CommitFailed(f"group {name!r} of stream {s.name!r} does not exist")
            refusal = self._refusal(i, f"group {name!r} of stream {s.name!r}", member_id, generation,
                                    self._head(i)[2], set(owned), set(partitions))
            if refusal:
                raise CommitFailed(refusal)
        finally:
            _unlock(s._lockp)

    def names(self) -> list[str]:
        s = self._s
        s._acquire()
        try:
            return sorted(n for used, n, _g, _s in map(self._head, range(L.MAX_GROUPS)) if used)
        finally:
            _unlock(s._lockp)

    def committed(self, name: str) -> dict:
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            return {} if i is None else self._committed(i)
        finally:
            _unlock(s._lockp)

    def members(self, name: str) -> int:
        """How many live members the group has."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            if i is None:
                return 0
            self._reap(i)
            return len(self._members(i))
        finally:
            _unlock(s._lockp)

    def set_offsets(self, name: str, offsets: dict, holder: int = 0) -> None:
        """Set committed offsets while the group has no live member (``Stream.reset``)
        other than ``holder`` (a Kafka group's stand-in, ``join_proxy``: its coordinator
        fences the Kafka members' commits itself)."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name, create=True)
            self._reap(i)
            if any(mid != holder for _m, _p, _s, mid in self._members(i)):
                raise ShmqError(f"group {name!r} of stream {s.name!r} has live members: close them first")
            for p, off in offsets.items():
                self._set_committed(i, p, off)
        finally:
            _unlock(s._lockp)

    def forget(self, name: str, partitions=None, holder: int = 0) -> bool:
        """Drop the committed offsets of ``partitions`` (None: the whole group, whose
        slot is freed) while the group has no live member other than ``holder``
        (ShmqError otherwise); False if there is no such group (Kafka's DeleteGroups and
        OffsetDelete)."""
        s = self._s
        s._acquire()
        try:
            i = self._find(name)
            if i is None:
                return False
            self._reap(i)
            if any(mid != holder for _m, _p, _s, mid in self._members(i)):
                raise ShmqError(f"group {name!r} of stream {s.name!r} has live members: close them first")
            if partitions is None:
                gtable.free(s._mm, i, self._head(i)[1].encode())
            else:
                for p in partitions:
                    self._set_committed(i, p, _NO)
            return True
        finally:
            _unlock(s._lockp)

    def floor(self, partition: int, idle_ns: int) -> int | None:
        """The lowest offset of ``partition`` a group still needs (retention="block"),
        or None when no group holds it. A group with no live member for longer than
        ``idle_ns`` holds nothing: a dead group never wedges producers."""
        s = self._s
        now = _mono()
        low = None
        s._acquire()
        try:
            for i in range(L.MAX_GROUPS):
                used, _n, _gen, seen = self._head(i)
                if not used:
                    continue
                self._reap(i)
                if not self._members(i) and now - self._head(i)[3] > idle_ns:
                    continue
                off = s._mq[self._committed_w(i, partition)]
                off = 0 if off == _NO else off
                low = off if low is None else min(low, off)
            return low
        finally:
            _unlock(s._lockp)
