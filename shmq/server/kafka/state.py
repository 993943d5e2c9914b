"""What the Kafka listener holds in memory that outlives a clean restart of a server that
persists (``--data-dir``): the idempotent producers' sequence numbers (``Sequences``) and
the metadata of the Kafka groups' committed offsets (``coordinator.Coordinator``).

Strategy: both are written to one file of the data dir, ``kafka-state.json`` (0600; its
format is ``persistence/kafka_state.py``'s), when the listener stops, after its last
connection closed, so nothing changes them after; the next start reads the file and
removes it at once. A server that dies without stopping
leaves no file behind, so a start never takes numbers older than the records they speak
of: the producers then start a new epoch (UNKNOWN_PRODUCER_ID) and the metadata reads
empty, as before. A sequence state is taken back only for a stream of the same creation
time (not one deleted and made again); metadata only while its offset is still the
committed one (``Coordinator._meta_of``). A damaged file is set aside, logged, and
forgotten: this is a convenience, never a reason not to start.
"""

import logging

from ...errors import ShmqError
from ...persistence.kafka_state import read_state, remove_state, set_aside_state, state_path, write_state

__all__ = ["keep", "restore", "for_backup"]

log = logging.getLogger("shmq.server")


def keep(listener, data_dir: str) -> None:
    """Write the listener's state into ``data_dir`` (atomically; a failure is logged)."""
    state = {"sequences": listener.sequences.export(),
             "metadata": listener.coordinator.export_metadata() if listener.coordinator is not None else []}
    try:
        path = write_state(data_dir, state)
    except OSError as e:
        log.warning("the Kafka producers' sequences and commit metadata are not kept: cannot write %s: %s",
                    state_path(data_dir), e.strerror or e)
        return
    log.info("kafka state kept in %s: %d producer partition(s), %d commit metadata", path,
             len(state["sequences"]), len(state["metadata"]),
             extra={"event": "kafka_state_kept", "path": path, "sequences": len(state["sequences"]),
                    "metadata": len(state["metadata"])})


def for_backup(listener) -> dict:
    """The state a backup keeps (``persistence.backup``; on the loop): the commit metadata,
    which a restore takes back only while its offset is still the committed one, and no
    producer sequences: taken while producers append, they could be older than the
    records copied, which a start must never take (above), so the producers of a server
    started from a backup begin new epochs, as after a crash."""
    return {"sequences": [],
            "metadata": listener.coordinator.export_metadata() if listener.coordinator is not None else []}


def restore(listener, data_dir: str) -> None:
    """Take back the state a clean stop kept in ``data_dir``, and remove its file."""
    path = state_path(data_dir)
    try:
        state = read_state(data_dir)
        if state is None:
            return
        seqs = listener.sequences.restore(state["sequences"], _created_at(listener))
        metas = listener.coordinator.restore_metadata(state["metadata"])
    except OSError as e:
        log.warning("cannot read %s: %s; the Kafka producers start new epochs", path, e.strerror or e)
        return
    except (ValueError, KeyError, TypeError) as e:
        aside = set_aside_state(data_dir)
        log.warning("%s is not a Kafka state this server wrote (%s): moved to %s; the Kafka producers start new "
                    "epochs", path, e, aside)
        return
    remove_state(data_dir)
    log.info("kafka state taken back from %s: %d producer partition(s), %d commit metadata", path, seqs, metas,
             extra={"event": "kafka_state_restored", "path": path, "sequences": seqs, "metadata": metas})


def _created_at(listener):
    """A stream's creation time by name (None: no such stream)."""
    def created_at(name):
        try:
            return listener.streams.get(name).created_at
        except (ShmqError, ValueError):  # gone: its state is not taken back
            return None
    return created_at
