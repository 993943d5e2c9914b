"""The deliveries one connection holds (``Leases``): the tags it hands out in CONSUME
replies, the checks of the tags it sends back, settling, and the release at its close.

Strategy: a delivery belongs to the connection that received it and to the queue handle
that leased it, so a tag is valid only there (docs/PROTOCOL.md, Delivery ids). A settle
first checks every tag, touching none if one is unknown; the deliveries then leave the
connection once the engine has settled them or found them gone — but not when it
changed nothing and asks for a retry (StorageError, LockTimeout): they stay, so a
retried request works and a close still makes them ready again at once. A batch
(a CONSUME's or a push's deliveries, an ACK's tags) is handled with one pass of C-level
calls (``map``, ``dict.update``) over its items, not a Python loop per message.
"""

import logging
from collections import deque
from itertools import count, islice, repeat
from operator import itemgetter

from ..engine.queues.delivery import plain_columns
from ..errors import DeliveryExpired, LockTimeout, QueueNotFound, ShmqError, StorageError
from ..protocol.payloads import delivery_fields, delivery_row

__all__ = ["Held", "Leases", "new_tags", "tag_counter"]

log = logging.getLogger("shmq.server")

_RETRY = (StorageError, LockTimeout)  # the engine changed nothing: the deliveries stay held
_queue_of, _delivery_of = itemgetter(0), itemgetter(1)
# Tags come from one count that servers in threads of one process share without a lock:
# its next() is one C step under the GIL, so each number goes to one taker only.
_tags = count(1)


def new_tags(n: int) -> list:
    """``n`` new tags of this process."""
    return list(islice(_tags, n))


def tag_counter():
    """The count the tags come from (the plain requests in C take theirs from it too)."""
    return _tags


def rows(ds, tags) -> list:
    """``ds`` as rows (``payloads.ROW_ITEMS``), ``tags`` naming their leases: in C passes when
    none has headers or options (the usual batch), else ``delivery_row`` each."""
    columns = plain_columns(ds)
    if columns is None:
        return list(map(delivery_row, ds, tags))
    ids, bodies, attempts, times = columns
    return list(zip(ids, tags, bodies, attempts, times))


class Held:
    """What one connection holds, by tag: a tag names a thing on that connection only
    (unique in the server process, never reused)."""

    __slots__ = ("held",)

    def __init__(self):
        self.held = {}

    def __len__(self):
        return len(self.held)

    def hold(self, thing) -> int:
        """A new tag for ``thing``, held from now."""
        tag = next(_tags)
        self.held[tag] = thing
        return tag


class Leases(Held):
    """tag -> (queue handle, Delivery) for one connection; ``pushed``: tag -> the
    subscription a held delivery was pushed for (``subscriptions``), told when it is settled."""

    __slots__ = ("pushed",)

    def __init__(self):
        super().__init__()
        self.pushed = {}

    def lease(self, q, ds, sub=None, as_rows=False) -> list:
        """The wire form of deliveries ``q`` just leased (maps; ``as_rows``: rows,
        ``payloads.ROW_ITEMS``); they are held from now (for the subscription ``sub``, if
        they are pushed)."""
        if len(ds) == 1 and sub is None:  # one delivery (a CONSUME of one): no batch to build
            tag = next(_tags)
            self.held[tag] = (q, ds[0])
            return [(delivery_row if as_rows else delivery_fields)(ds[0], tag)]
        tags = new_tags(len(ds))
        self.held.update(zip(tags, zip(repeat(q), ds)))
        if sub is not None:
            self.pushed.update(dict.fromkeys(tags, sub))
            sub.held(tags)
        if as_rows:
            return rows(ds, tags)
        return list(map(delivery_fields, ds, tags))

    def unsubscribe(self, tags):
        """The deliveries of ``tags`` no longer count for their subscription (it closed)."""
        pushed = self.pushed
        for t in tags:
            pushed.pop(t, None)

    def take(self, q, tags) -> list:
        """The deliveries named by ``tags`` (all held, all of ``q``; each once), still
        held; else DeliveryExpired naming the unknown ones (and touching none)."""
        held = self.held
        if len(tags) == 1:  # one tag (an ACK of one delivery): no batch to build
            pair = held.get(tags[0])
            if pair is not None and pair[0] is q:
                return [pair[1]]
        try:
            pairs = list(map(held.__getitem__, dict.fromkeys(tags)))  # a tag named twice counts once
        except KeyError:
            pairs = None
        if pairs is not None and set(map(_queue_of, pairs)) <= {q}:  # handles compare by identity
            return list(map(_delivery_of, pairs))
        unknown = [t for t in tags if t not in held or held[t][0] is not q]
        raise DeliveryExpired(f"unknown deliveries on this connection: {unknown[:10]}")

    def settle(self, q, tags, settle):
        """``settle(deliveries)`` for the deliveries of ``tags`` (see ``take``), which are
        held no more afterwards — unless it raised StorageError or LockTimeout."""
        ds = self.take(q, tags)
        try:
            result = settle(ds)
        except _RETRY:
            raise
        except Exception:
            self._drop(tags)
            raise
        self._drop(tags)
        return result

    def _drop(self, tags):
        deque(map(self.held.pop, tags, repeat(None)), 0)  # (one C pass)
        pushed = self.pushed
        if pushed:
            subs = list(map(pushed.pop, tags, repeat(None)))
            if len(set(subs)) == 1:  # the usual case: all of one subscription, or of none
                if subs[0] is not None:
                    subs[0].settled(tags)  # room for more pushes
                return
            for sub, t in zip(subs, tags):
                if sub is not None:
                    sub.settled((t,))

    def release(self, notify, peer):
        """Every delivery still held is ready again at once (the connection closed);
        ``notify(name)`` is told of each queue that got some back."""
        if not self.held:
            return
        log.info("%s: closed holding %d deliveries: ready again", peer, len(self.held))
        by_queue = {}
        for q, d in self.held.values():
            by_queue.setdefault(q, []).append(d)
        self.held.clear()
        self.pushed.clear()
        for q, ds in by_queue.items():
            if q.deleted:  # deleted (or its handle closed with it): nothing to give back
                continue
            try:
                q.nack_many(ds, 0.0)  # requeued now (not by the retry policy)
            except (DeliveryExpired, QueueNotFound):
                continue
            except ShmqError as e:
                log.warning("%s: could not release %d deliveries of %s: %s", peer, len(ds), q.name, e)
                continue
            notify(q.name)
