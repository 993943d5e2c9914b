"""``Transactions``: the server's transaction coordinator (Kafka's KIP-98, for Kafka
producers with a ``transactional.id`` and for native ones: ``client/transactions.py``):
producer ids and epochs that fence a zombie, the partitions and groups a transaction
takes in, its offsets pending until it ends, the markers that end it in each partition,
and the timeouts that abort it.

Strategy: one coordinator on the server's loop, as Kafka's is one per transactional id;
its state machine is Kafka's, without the waits a cluster needs: an end writes the
markers (a record at an offset of each partition, which a Kafka Fetch sends as a control
batch) and applies the group offsets before it answers, so a transaction is never seen
"preparing". What a Fetch needs of the partitions is ``TxnIndex``'s. Every event goes to
the journal (``persistence/kafka_txns.py``) before the answer, so a server killed at any
point starts with every transaction it knew: one decided (its end answered or not) is
completed, one still open is aborted, its producer fenced; never half-visible. A native
group's offsets in a transaction are committed at its end, fenced as the member's own
commit is (``Groups.commit``): a member that lost a partition since makes the transaction
abort (CommitFailed), so its records are never seen without its offsets. Errors carry
Kafka's codes (``TxnError``); the DEADBEEF front turns them into shmq's exceptions.
"""

import asyncio
import logging
import time

from ...engine.shm.segment import check_queue_name
from ...engine.shm.waits import serving
from ...engine.shm.layout import FLAG_ABORTED, FLAG_CONTROL, WAL_ALWAYS, WAL_BATCH, WAL_NEVER
from ...errors import CommitFailed, ShmqError, StreamNotFound
from ...kafka import ErrorCode as E
from ...kafka import KafkaProtocolError
from ...kafka.control import CONTROL, TRANSACTIONAL, marker
from ...persistence.kafka_txns import Journal, journal_path, read_journal, runtime_journal_path, set_aside_journal
from . import native
from .index import DATA, TxnIndex, PartitionTxns
from .intents import DATA as APPENDING, MARK as MARKING, Intents, digest, locate
from .state import (COMPLETE_ABORT, COMPLETE_COMMIT, EMPTY, MAX_EPOCH, MAX_TIMEOUT_MS, ONGOING, PREPARE_ABORT,
                    PREPARE_COMMIT, ProducerIds, Txn, TxnError, ms_time)

__all__ = ["Transactions", "TxnError", "ProducerIds", "MAX_TIMEOUT_MS"]

log = logging.getLogger("shmq.server")

SWEEP_S = 1.0  # how often open transactions are checked against their timeout


class Transactions:
    """The transaction coordinator of ``broker``'s namespace, with the server's stream
    handles (``streams``: ``tcp.AttachedHandles``); ``kafka``: the Kafka listener, when
    the server has one (its groups' offsets, its kept batches)."""

    def __init__(self, broker, streams, ids: ProducerIds | None = None):
        self.broker = broker
        self.streams = streams
        self.ids = ids if ids is not None else ProducerIds()
        self.kafka = None
        self.txns: dict[str, Txn] = {}
        self.by_pid: dict[int, Txn] = {}
        self.index = TxnIndex()
        self.intents = Intents()  # appends begun and not yet noted (``intents.py``)
        self.journal = None
        self.path = None  # where the journal goes (None: not started, or it cannot be written)
        self.fsync = (WAL_NEVER, 0)  # a server with a data dir sets its --fsync policy (main.serve)
        self._sync_due = None
        self._sweeper = None

    # ------------------------------------------------------------------ life
    async def start(self, data_dir: str | None) -> None:
        """Take back the journal (in ``data_dir``, or with no data dir beside the
        namespace's shared memory), completing or aborting what it left; keep one from
        now on; time out open transactions."""
        path = journal_path(data_dir) if data_dir is not None else runtime_journal_path(self.broker.namespace)
        events = None
        try:
            events = read_journal(path)
        except OSError as e:  # (not written over: it may be read again once the cause is fixed)
            log.warning("cannot read %s: %s; transactions are not journaled", path, e.strerror or e)
            path = None
        except (ValueError, TypeError) as e:
            aside = set_aside_journal(path)
            log.warning("%s is not a transaction journal this server wrote (%s): moved to %s", path, e, aside)
        self.path = path
        if events:
            self._replay(events)
            self._open_journal()
        await self._settle_replayed()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._sync_due is not None:
            self._sync_due.cancel()
            self._sync_due = None
        if self.journal is not None:
            try:
                self.journal.rewrite(self.rows())
            except OSError as e:
                log.warning("cannot write %s: %s", self.journal.path, e.strerror or e)
            self.journal.close()
            self.journal = None

    def _open_journal(self) -> None:
        """The journal written anew with what is held (made at the first event: a server
        whose clients never use transactions has none)."""
        try:
            self.journal = Journal(self.path, self.rows())
        except OSError as e:
            log.warning("transactions are not journaled: cannot write %s: %s", self.path, e.strerror or e)
            self.path = None

    def _note(self, event) -> None:
        """``event`` happened (what is held says so already): into the journal, synced by
        the server's ``--fsync`` policy (``fsync``: the logs' mode and batch ms)."""
        if self.journal is not None:
            try:
                self.journal.write(event)
            except OSError as e:  # (a full disk): said, and the coordinator goes on in memory
                log.warning("a transaction event is not journaled: cannot write %s: %s", self.journal.path,
                            e.strerror or e)
                return
        elif self.path is not None:
            self._open_journal()  # (written anew and fsynced)
            return
        else:
            return
        mode, ms = self.fsync
        if mode == WAL_ALWAYS:
            self._sync()
        elif mode == WAL_BATCH and self._sync_due is None:
            self._sync_due = asyncio.get_running_loop().call_later(ms / 1000, self._sync)

    def _sync(self) -> None:
        self._sync_due = None
        if self.journal is not None:
            try:
                self.journal.sync()
            except OSError as e:
                log.warning("cannot fsync %s: %s", self.journal.path, e.strerror or e)

    def rows(self) -> list:
        """The journal's events that make what is held now."""
        rows = []
        for t in self.txns.values():
            rows.append(t.row())
            rows += [["add", t.tid, *key, first] for key, first in t.partitions.items()]
            rows += [["group", t.tid, g] for g in sorted(t.groups)]
            for g, offs in t.offsets.items():
                rows.append(["offsets", t.tid, g, [[tp, p, *v] for (tp, p), v in offs.items()]])
            for (g, name), (member, gen, owned, offs) in t.native.items():
                rows.append(["noffsets", t.tid, g, name, member, gen, owned, [[p, o] for p, o in offs.items()]])
        for key, part in self.index.parts.items():
            if part:
                rows.append(["part", *key, part.export()])
        return rows + self.intents.rows()

    def _replay(self, events) -> None:
        for e in events:
            try:
                self._apply(e)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                log.warning("a transaction journal event %r is not understood (%s): skipped", e, exc)

    def _apply(self, e) -> None:
        kind = e[0]
        if kind == "txn":
            _k, tid, pid, epoch, timeout_ms, state, started = e
            t = self.txns.get(tid)
            if t is None or t.pid != pid:
                if t is not None:
                    self.by_pid.pop(t.pid, None)
                t = self.txns[tid] = Txn(tid, pid, epoch, timeout_ms)
                self.by_pid[pid] = t
                self.ids.above(pid)
            t.epoch, t.timeout_ms, t.state, t.started = epoch, timeout_ms, state, started
            if state in (EMPTY, COMPLETE_COMMIT, COMPLETE_ABORT):
                t.clear()
        elif kind in ("add", "begin"):  # (a partition taken in; its first record's place, when it came)
            _k, tid, name, created, p, first = e
            t = self.txns[tid]
            key = (name, created, p)
            if first is None:
                t.partitions.setdefault(key, None)
            else:
                t.partitions[key] = first
                self.index.of(key).begin(t.pid, first)
        elif kind == "group":
            self.txns[e[1]].groups.add(e[2])
        elif kind == "offsets":
            _k, tid, group, rows = e
            offs = self.txns[tid].offsets.setdefault(group, {})
            for tp, p, offset, meta, epoch in rows:
                offs[(tp, p)] = (offset, meta, epoch)
        elif kind == "noffsets":
            _k, tid, group, name, member, gen, owned, rows = e
            native.hold(self.txns[tid], group, name, member, gen, owned, {p: o for p, o in rows})
        elif kind == "batch":
            _k, pid, epoch, name, created, p, first, count = e
            self.index.of((name, created, p)).appended(pid, epoch, first, count)
            self.intents.done(APPENDING, pid, (name, created, p), count)
        elif kind == "marker":
            _k, pid, epoch, name, created, p, offset, commit = e
            self.index.of((name, created, p)).ended(pid, epoch, offset, commit)
            self.intents.done(MARKING, pid, (name, created, p), commit)
            t = self.by_pid.get(pid)
            if t is not None:
                t.marked.add((name, created, p))
        elif kind == "part":
            _k, name, created, p, row = e
            self.index.parts[(name, created, p)] = PartitionTxns.restore(row, 2**63)
        elif kind in (APPENDING, MARKING):
            _k, pid, epoch, name, created, p, after, *what = e
            if not (type(pid) is int and type(epoch) is int and type(after) is int and len(what) == (
                    2 if kind == APPENDING else 1)):
                raise ValueError(f"an intent {e!r:.80}")
            self.intents.add(list(e))
        else:
            raise ValueError(f"no event {kind!r}")

    async def _settle_replayed(self) -> None:
        """What the journal left mid-way: a decided transaction completed, an open one
        aborted (its producer fenced: the epoch moves on). A partition rebuilt shorter
        than the journal knew (from a backup, or an older snapshot after a reboot) keeps
        what it holds; an aborted transaction whose marker it lost is aborted again, at
        its end, as is any transaction open there that no producer holds any more."""
        for key, part in list(self.index.parts.items()):
            s = self._stream(key)
            if s is None:  # its stream was deleted, or made again
                del self.index.parts[key]
                continue
            end = s.offsets(key[2])[1]
            lost = [(first, pid) for m, first, pid in part.aborted if m >= end and first < end]
            part = self.index.parts[key] = PartitionTxns.restore(part.export(), end)
            for first, pid in lost:
                part.open.setdefault(pid, first)
        self._find_intents()
        for t in list(self.txns.values()):
            if t.state == ONGOING:
                log.info("transaction %r (producer %d) was open when the server stopped: aborted", t.tid, t.pid,
                         extra={"event": "kafka_txn_aborted", "transactional_id": t.tid, "reason": "restart"})
                await self._end(t, False, bump=True)
            elif t.state in (PREPARE_COMMIT, PREPARE_ABORT):
                try:
                    await self._end(t, t.state == PREPARE_COMMIT, bump=False, replayed=True)
                except CommitFailed as e:
                    log.info("transaction %r (producer %d) aborted at the restart: %s", t.tid, t.pid, e,
                             extra={"event": "kafka_txn_aborted", "transactional_id": t.tid, "reason": "restart"})
        for key, part in list(self.index.parts.items()):
            for pid in list(part.open):
                t = self.by_pid.get(pid)
                log.info("%s partition %d: producer %d's transaction there has no end: aborted", key[0], key[2], pid,
                         extra={"event": "kafka_txn_aborted", "topic": key[0], "partition": key[2],
                                "reason": "restart"})
                await self._write_marker(key, pid, t.epoch if t is not None else 0, False, "")
        self._reveal()

    def _find_intents(self) -> None:
        """The appends the journal began and never noted, found in their partitions and
        noted now (``intents.locate``), before any transaction is ended: records a
        server killed between an append and its note left are their producer's, and a
        marker is a marker, never a plain record."""
        for key, held in list(self.intents.by_key.items()):
            s = self._stream(key)
            for e in list(held):
                self.intents.drop(e)
                if s is None:
                    continue
                part = self.index.of(key)
                at = locate(s, key[2], part.spans, e)
                _k, pid, epoch, *_key, _after, what = e[:8]
                if at is None:
                    continue
                log.info("%s partition %d: producer %d's %s at offset %d, appended as the server stopped, is "
                         "its transaction's", key[0], key[2], pid, "batch" if e[0] == APPENDING else "marker", at,
                         extra={"event": "kafka_txn_append_found", "topic": key[0], "partition": key[2],
                                "producer_id": pid, "offset": at})
                if e[0] == APPENDING:
                    part.begin(pid, at)
                    part.appended(pid, epoch, at, what)
                    self._note(["batch", pid, epoch, *key, at, what])
                else:
                    part.ended(pid, epoch, at, what)
                    self._note(["marker", pid, epoch, *key, at, what])
                    t = self.by_pid.get(pid)
                    if t is not None and t.state in (PREPARE_COMMIT, PREPARE_ABORT):
                        t.marked.add(key)

    # ------------------------------------------------------------------ checks
    def _txn(self, tid: str, pid: int, epoch: int, fenced: E) -> Txn:
        t = self.txns.get(tid)
        if t is None or t.pid != pid:
            raise TxnError(E.invalid_producer_id_mapping,
                           f"transactional id {tid!r} has no producer {pid}")
        if epoch != t.epoch:
            raise TxnError(fenced, f"transactional id {tid!r}: epoch {epoch} is not the current {t.epoch} "
                                   "(another producer took the id over)")
        if t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise TxnError(E.concurrent_transactions)
        return t

    def _begin(self, t: Txn) -> None:
        if t.state != ONGOING:
            t.state, t.started = ONGOING, time.time()
            t.clear()
            self._note(t.row())

    def topic(self, name: str):
        """(stream handle or None, Kafka's code) of stream ``name``."""
        try:
            check_queue_name(name)
        except (ValueError, TypeError):
            return None, E.invalid_topic_exception
        try:
            return self.streams.get(name), E.none
        except StreamNotFound:
            return None, E.unknown_topic_or_partition

    def _stream(self, key):
        name, created, p = key
        s, _code = self.topic(name)
        if s is None or s.created_at != created or not 0 <= p < s.partitions:
            return None
        return s

    # ------------------------------------------------------------------ APIs
    async def init(self, tid: str, timeout_ms: int, pid: int, epoch: int, fenced: E) -> tuple[int, int]:
        """InitProducerId with a transactional id: (producer id, epoch). An open
        transaction of the id is aborted first; the epoch moves on, fencing whoever held
        it (KIP-360: a producer naming its id and epoch gets the next one)."""
        if not tid:
            raise TxnError(E.invalid_request, "an empty transactional id")
        if not 1 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise TxnError(E.invalid_transaction_timeout,
                           f"transaction.timeout.ms {timeout_ms}: 1 to {MAX_TIMEOUT_MS}")
        t = self.txns.get(tid)
        if t is not None and pid >= 0 and (pid != t.pid or epoch != t.epoch):
            raise TxnError(fenced if pid == t.pid else E.invalid_producer_id_mapping,
                           f"transactional id {tid!r} is held by producer {t.pid} at epoch {t.epoch}")
        if t is not None and t.state in (PREPARE_COMMIT, PREPARE_ABORT):
            raise TxnError(E.concurrent_transactions)
        if t is not None and t.state == ONGOING:
            log.info("transaction %r (producer %d, epoch %d) aborted: the id was initialized again", tid, t.pid,
                     t.epoch, extra={"event": "kafka_txn_aborted", "transactional_id": tid, "reason": "fenced"})
            await self._end(t, False, bump=False)
        if t is None or t.epoch + 1 > MAX_EPOCH:
            new_pid = self.ids.next()
            if t is not None:
                self.by_pid.pop(t.pid, None)
            t = self.txns[tid] = Txn(tid, new_pid, 0, timeout_ms)
            self.by_pid[new_pid] = t
        else:
            t.epoch += 1
        t.timeout_ms, t.state = timeout_ms, EMPTY
        self._note(t.row())
        return t.pid, t.epoch

    def add_partitions(self, tid: str, pid: int, epoch: int, topics: dict, fenced: E) -> dict:
        """AddPartitionsToTxn of {topic: [partition]}: {topic: [(partition, code)]}, all or
        none (a partition that is not there fails the rest with OPERATION_NOT_ATTEMPTED)."""
        try:
            t = self._txn(tid, pid, epoch, fenced)
        except TxnError as e:
            return {name: [(p, e.code) for p in parts] for name, parts in topics.items()}
        bad, found = {}, []
        for name, parts in topics.items():
            s, code = self.topic(name)
            for p in parts:
                if s is None or not 0 <= p < s.partitions:
                    bad[(name, p)] = code if s is None else E.unknown_topic_or_partition
                else:
                    found.append((s, name, p))
        if bad:
            return {name: [(p, bad.get((name, p), E.operation_not_attempted)) for p in parts]
                    for name, parts in topics.items()}
        self._begin(t)
        for s, name, p in found:
            key = (name, s.created_at, p)
            if key not in t.partitions:  # (it holds readers back from its first record on: ``producing``)
                t.partitions[key] = None
                self._note(["add", tid, *key, None])
        return {name: [(p, E.none) for p in parts] for name, parts in topics.items()}

    def add_offsets(self, tid: str, pid: int, epoch: int, group: str, fenced: E) -> None:
        """AddOffsetsToTxn: ``group``'s offsets will be committed with the transaction."""
        t = self._txn(tid, pid, epoch, fenced)
        if not group:
            raise TxnError(E.invalid_group_id)
        self._begin(t)
        if group not in t.groups:
            t.groups.add(group)
            self._note(["group", tid, group])

    def commit_offsets(self, tid: str, group: str, pid: int, epoch: int, member: tuple, topics: dict,
                       fenced: E) -> dict:
        """TxnOffsetCommit of {topic: [(partition, offset, metadata, leader epoch)]}:
        {topic: [(partition, code)]}. The offsets wait for the transaction's end; a
        member of a Kafka group commits in its generation (KIP-447: a zombie of an old
        one is fenced)."""
        try:
            t = self._txn(tid, pid, epoch, fenced)
            if t.state != ONGOING or group not in t.groups:
                raise TxnError(E.invalid_txn_state, f"AddOffsetsToTxn of group {group!r} first")
            if self.kafka is None:  # (a server without the listener has no Kafka group)
                raise TxnError(E.coordinator_not_available, "no Kafka listener on this server")
            self.kafka.coordinator.check_member(group, *member)
        except TxnError as e:
            return {name: [(p, e.code) for p, *_ in parts] for name, parts in topics.items()}
        except Exception as e:  # GroupError: its code
            code = getattr(e, "code", E.unknown_server_error)
            return {name: [(p, code) for p, *_ in parts] for name, parts in topics.items()}
        out, rows = {}, []
        offs = t.offsets.setdefault(group, {})
        for name, parts in topics.items():
            res = out[name] = []
            s, _code = self.topic(name)
            for p, offset, meta, lepoch in parts:
                if s is None or not 0 <= p < s.partitions:  # (a group's offsets are kept in its stream)
                    res.append((p, E.unknown_topic_or_partition))
                    continue
                offs[(name, p)] = (offset, meta or "", lepoch)  # a negative one too (no position), as OffsetCommit
                rows.append([name, p, offset, meta or "", lepoch])
                res.append((p, E.none))
        if rows:
            self._note(["offsets", tid, group, rows])
        return out

    async def end(self, tid: str, pid: int, epoch: int, commit: bool, fenced: E) -> None:
        """EndTxn: the transaction committed (its records visible to read_committed
        consumers, its offsets the group's) or aborted. Done when it returns; a retry of
        the same end is answered as done."""
        t = self._txn(tid, pid, epoch, fenced)
        if t.state == (COMPLETE_COMMIT if commit else COMPLETE_ABORT):
            return
        if t.state != ONGOING:
            if not commit and t.state == EMPTY:  # nothing to abort (a client aborting an empty transaction)
                return
            raise TxnError(E.invalid_txn_state, f"transactional id {tid!r} is {t.state}: no transaction to "
                                                f"{'commit' if commit else 'abort'}")
        await self._end(t, commit, bump=False)

    async def _end(self, t: Txn, commit: bool, bump: bool, replayed: bool = False) -> None:
        """Commit a native group's offsets (fenced: ``native.commit``), write the markers,
        apply or drop the Kafka groups' offsets, complete; ``bump``: the epoch moves on (a
        timeout or a restart aborts: the producer that held it is fenced). A commit whose
        native offsets are refused aborts instead, and raises that CommitFailed once done.
        ``replayed``: a commit the journal left prepared, whose native offsets are taken
        as committed if the groups hold them (``native.held``), else it aborts."""
        t.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        self._note(t.row())
        refused = None
        if commit and t.native:
            if replayed:
                if not native.held(t, self.topic):
                    refused = CommitFailed(f"transaction {t.tid!r}: its groups' offsets were not committed when the "
                                           "server stopped")
            else:
                refused = native.commit(t, self.topic)
            if refused is not None:
                commit, t.state = False, PREPARE_ABORT
                self._note(t.row())
        for key in list(t.partitions):
            if key not in t.marked:
                await self._marker(t, key, commit)
                t.marked.add(key)
        if commit:
            for group, offs in t.offsets.items():
                self._store_kafka_offsets(group, offs)
        if bump:
            if t.epoch + 1 > MAX_EPOCH:
                self.by_pid.pop(t.pid, None)
                t.pid, t.epoch = self.ids.next(), 0
                self.by_pid[t.pid] = t
            else:
                t.epoch += 1
        t.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        t.clear()
        self._note(t.row())
        if self.journal is not None and self.journal.due:
            try:
                self.journal.rewrite(self.rows())
            except OSError as e:
                log.warning("cannot write %s anew: %s", self.journal.path, e.strerror or e)
        if refused is not None:
            raise refused

    def _store_kafka_offsets(self, group: str, offs: dict) -> None:
        """A committed transaction's Kafka group offsets made the group's (through the
        listener's group coordinator; a server started without it stores them in the
        streams' groups, which then have no Kafka member)."""
        topics = {}
        for (name, p), (offset, meta, lepoch) in offs.items():
            topics.setdefault(name, []).append((p, offset, meta, lepoch))
        if self.kafka is not None:
            for name, codes in self.kafka.coordinator.store_committed(group, topics).items():
                refused = [(p, code.name) for p, code in codes if code != E.none]
                if refused:  # (the records are committed: said, never dropped silently)
                    log.warning("Kafka group %s: the offsets of a committed transaction in %s are not stored: %s",
                                group, name, ", ".join(f"partition {p}: {why}" for p, why in refused))
            return
        for name, parts in topics.items():
            s, _code = self.topic(name)
            try:
                if s is None:
                    raise StreamNotFound(f"no stream {name!r}")
                s.groups_table.set_offsets(group, {p: offset for p, offset, *_rest in parts if offset >= 0})
                unset = [p for p, offset, *_rest in parts if offset < 0]  # no position (OffsetCommit's rule)
                if unset:
                    s.groups_table.forget(group, unset)
            except ShmqError as e:
                log.warning("Kafka group %s: the offsets of a committed transaction in %s are not stored: %s",
                            group, name, e)

    # ------------------------------------------------------------------ native groups
    def commit_native_offsets(self, tid: str, pid: int, epoch: int, group: str, stream: str, member: int,
                              generation: int, owned, offsets: dict, fenced: E) -> None:
        """A native group member's offsets ({partition: next offset}) held in the
        transaction, committed at its end as the member's own commit would be: CommitFailed
        now if the member does not own them (``Groups.check``), and at the end if it lost
        one since (the transaction then aborts)."""
        t = self._txn(tid, pid, epoch, fenced)
        s, code = self.topic(stream)
        if s is None:
            raise TxnError(code, f"no stream {stream!r}")
        for p, offset in offsets.items():
            if not 0 <= p < s.partitions or offset < 0:
                raise TxnError(E.unknown_topic_or_partition if offset >= 0 else E.invalid_commit_offset_size,
                               f"stream {stream!r}: no partition {p}, or offset {offset} below 0")
        s.groups_table.check(group, member, generation, owned, offsets)
        self._begin(t)
        native.hold(t, group, stream, member, generation, owned, offsets)
        self._note(["noffsets", tid, group, stream, member, generation, sorted(owned),
                    [[p, o] for p, o in offsets.items()]])

    @staticmethod
    def _show(s, p: int, part: PartitionTxns, pid: int, commit: bool) -> None:
        """Before ``pid``'s marker: native readers (``Partition.read(visible=True)``) pass
        over its records if it aborted, and read up to the next open transaction's."""
        first = part.open.get(pid)
        if not commit and first is not None:  # (none: the transaction wrote nothing here)
            s.hide(p, [(f, e) for f, e, spid, _ep, kind in part.spans if spid == pid and kind == DATA and e > first],
                   FLAG_ABORTED)
        rest = [f for other, f in part.open.items() if other != pid]
        s.set_stable(p, min(rest) if rest else None)

    def _reveal(self) -> None:
        """What native readers must pass over, set again on the records (a reboot rebuilt
        them from logs and snapshots, which keep no such flag): every marker, every
        aborted transaction's records, and each partition's last stable offset."""
        for key, part in self.index.parts.items():
            s = self._stream(key)
            if s is None:
                continue
            p = key[2]
            markers = [(f, e) for f, e, _pid, _ep, kind in part.spans if kind != DATA]
            aborted = [(f, e) for m, first, pid in part.aborted for f, e, spid, _ep, kind in part.spans
                       if spid == pid and kind == DATA and first <= f < m]
            s.hide(p, markers, FLAG_CONTROL)
            s.hide(p, aborted, FLAG_ABORTED)
            s.set_stable(p, min(part.open.values()) if part.open else None)

    async def _marker(self, t: Txn, key: tuple, commit: bool) -> None:
        """``t``'s marker in one partition."""
        await self._write_marker(key, t.pid, t.epoch, commit, t.tid)

    async def _write_marker(self, key: tuple, pid: int, epoch: int, commit: bool, tid: str) -> None:
        """Producer ``pid``'s COMMIT or ABORT marker in one partition (a partition gone with
        its stream has none)."""
        s = self._stream(key)
        part = self.index.of(key)
        if s is None:
            part.open.pop(pid, None)
            return
        k, v = marker(commit)
        p = key[2]
        intent = None
        try:
            self._show(s, p, part, pid, commit)
            intent = self._intend([MARKING, pid, epoch, *key, s.offsets(p)[1], commit])
            if s.retention == "block":  # may wait for the slowest group: not on the loop
                offset = await asyncio.to_thread(s.append_marker, p, k, v)
            else:
                with serving():
                    offset = s.append_marker(p, k, v)
        except ShmqError as e:  # the records stay out of reach of read_committed consumers, as if still open
            if intent is not None:
                self.intents.drop(intent)
            log.warning("transaction %r: the %s marker of %s partition %d cannot be written: %s", tid,
                        "COMMIT" if commit else "ABORT", key[0], p, e)
            raise TxnError(E.kafka_storage_error, str(e)) from None
        self.intents.drop(intent)
        part.ended(pid, epoch, offset, commit)
        self._note(["marker", pid, epoch, *key, offset, commit])
        now = time.time_ns() // 1_000_000
        if self.kafka is not None:  # (kept as the batch a Fetch sends; a listener has the kafka extra's codec)
            from ...kafka.records import Record, encode_batch
            self.kafka.batches.put(s, p, offset, encode_batch(
                [Record(offset, now, k, v)], producer_id=pid, producer_epoch=epoch,
                attributes=TRANSACTIONAL | CONTROL), 1)
        self.streams.notify(key[0])

    # ------------------------------------------------------------------ produce, fetch
    def producing(self, tid: str | None, pid: int, epoch: int, s, p: int) -> None:
        """Before a transactional batch is appended: KafkaProtocolError unless ``pid`` at
        ``epoch`` has an open transaction that took this partition in."""
        t = self.by_pid.get(pid)
        if t is None or (tid is not None and t.tid != tid):
            raise KafkaProtocolError(f"producer {pid} has no transaction here", E.invalid_producer_id_mapping)
        if epoch != t.epoch:
            raise KafkaProtocolError(f"producer {pid}: epoch {epoch} is not the current {t.epoch}",
                                     E.invalid_producer_epoch)
        key = (s.name, s.created_at, p)
        if t.state != ONGOING or key not in t.partitions:
            raise KafkaProtocolError(f"producer {pid}'s transaction has not added {s.name!r} partition {p} "
                                     "(AddPartitionsToTxn first)", E.invalid_txn_state)
        if t.partitions[key] is None:  # its first records here: readers stop where they will go, before they do
            first = s.offsets(p)[1]
            t.partitions[key] = first
            part = self.index.of(key)
            part.begin(t.pid, first)
            s.set_stable(p, min(part.open.values()))
            self._note(["begin", t.tid, *key, first])

    def adding(self, tid: str, pid: int, epoch: int, s, p: int, fenced: E) -> None:
        """Before a native transactional append to partition ``p`` of ``s``: the partition
        taken in (AddPartitionsToTxn's), readers held back from where the records go
        (``producing``); TxnError with Kafka's code otherwise."""
        self._txn(tid, pid, epoch, fenced)  # (a refusal says why)
        (code,) = (c for _p, c in self.add_partitions(tid, pid, epoch, {s.name: [p]}, fenced)[s.name])
        if code != E.none:
            raise TxnError(code, f"transactional id {tid!r}: stream {s.name!r} partition {p} cannot be added "
                                 f"({code.name})")
        try:
            self.producing(tid, pid, epoch, s, p)
        except KafkaProtocolError as e:
            raise TxnError(e.code, str(e)) from None

    def appending(self, pid: int, epoch: int, s, p: int, values) -> list:
        """Before a transactional batch of ``values`` is appended to partition ``p`` (once
        ``producing`` let it): its intent journaled (``intents.py``), which ``produced``
        takes once it is appended, ``not_appended`` if the append failed."""
        return self._intend([APPENDING, pid, epoch, s.name, s.created_at, p, s.offsets(p)[1], len(values),
                             digest(values)])

    def not_appended(self, intent: list) -> None:
        """``appending``'s batch was not appended (an append is all or nothing)."""
        self.intents.drop(intent)

    def _intend(self, event: list) -> list:
        self.intents.add(event)
        self._note(event)
        return event

    def produced(self, pid: int, epoch: int, s, p: int, first: int, count: int, intent: list | None = None) -> None:
        """A transactional batch was appended at ``first`` (``intent``: ``appending``'s)."""
        key = (s.name, s.created_at, p)
        part = self.index.of(key)
        part.appended(pid, epoch, first, count, DATA)
        if intent is not None:
            self.intents.drop(intent)
        self._note(["batch", pid, epoch, *key, first, count])
        t = self.by_pid.get(pid)
        if t is None or t.epoch != epoch or t.state != ONGOING or key not in t.partitions:
            # ended while the batch waited for room (retention="block"): it is aborted at once
            part.begin(pid, first)
            k, v = marker(False)
            self._show(s, p, part, pid, False)
            intent = self._intend([MARKING, pid, epoch, *key, s.offsets(p)[1], False])
            try:
                offset = s.append_marker(p, k, v)
            finally:
                self.intents.drop(intent)
            part.ended(pid, epoch, offset, False)
            self._note(["marker", pid, epoch, *key, offset, False])

    def pending(self, group: str) -> set:
        """(topic, partition) of ``group`` with offsets an open transaction holds."""
        out = set()
        for t in self.txns.values():
            if t.state != COMPLETE_COMMIT and group in t.offsets:
                out.update(t.offsets[group])
            for (g, name), held in t.native.items():
                if g == group:
                    out.update((name, p) for p in held[3])
        return out

    def forget(self, name: str) -> None:
        """A topic was deleted."""
        self.index.forget(name)

    # ------------------------------------------------------------------ timeouts
    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.time()
            for t in list(self.txns.values()):
                if t.state == ONGOING and now - t.started > t.timeout_ms / 1000:
                    log.info("transaction %r (producer %d, epoch %d) aborted: open past its timeout of %d ms",
                             t.tid, t.pid, t.epoch, t.timeout_ms,
                             extra={"event": "kafka_txn_aborted", "transactional_id": t.tid, "reason": "timeout"})
                    try:
                        await self._end(t, False, bump=True)
                    except (TxnError, ShmqError):
                        pass
            for key, part in list(self.index.parts.items()):
                if part.spans and not part.open:
                    s = self._stream(key)
                    if s is None:
                        del self.index.parts[key]
                    else:
                        part.trim(s.offsets(key[2])[0])

    def describe(self, tid: str) -> dict | None:
        t = self.txns.get(tid)
        if t is None:
            return None
        topics = {}
        for name, _created, p in t.partitions:
            topics.setdefault(name, []).append(p)
        return {"transactional_id": tid, "transaction_state": t.state, "transaction_timeout": t.timeout_ms,
                "transaction_start_time": ms_time(int(t.started * 1000) if t.started else -1),
                "producer_id": t.pid, "producer_epoch": t.epoch,
                "topics": [{"topic": n, "partitions": sorted(ps)} for n, ps in topics.items()]}
