"""What the Kafka listener holds in memory that outlives a clean restart of a server that
persists (``--data-dir``): the idempotent producers' sequence numbers (``Sequences``) and
the metadata of the Kafka groups' committed offsets (``groups.Coordinator``).

Strategy: both are written to one file of the data dir, ``kafka-state.json`` (0600), when
the listener stops, after its last connection closed, so nothing changes them after; the
next start reads the file and removes it at once. A server that dies without stopping
leaves no file behind, so a start never takes numbers older than the records they speak
of: the producers then start a new epoch (UNKNOWN_PRODUCER_ID) and the metadata reads
empty, as before. A sequence state is taken back only for a stream of the same creation
time (not one deleted and made again); metadata only while its offset is still the
committed one (``Coordinator._meta_of``). A damaged file is set aside, logged, and
forgotten: this is a convenience, never a reason not to start.
"""

import json
import logging
import os

from ...errors import ShmqError
from ...persistence.files import KAFKA_STATE_FILE

__all__ = ["FILE", "keep", "restore"]

FILE = KAFKA_STATE_FILE  # (the data dir's file names are persistence.files's)
VERSION = 1

log = logging.getLogger("shmq.server")


def keep(listener, data_dir: str) -> None:
    """Write the listener's state into ``data_dir`` (atomically; a failure is logged)."""
    state = {"version": VERSION, "sequences": listener.sequences.export(),
             "metadata": listener.coordinator.export_metadata() if listener.coordinator is not None else []}
    path = os.path.join(data_dir, FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        log.warning("the Kafka producers' sequences and commit metadata are not kept: cannot write %s: %s", path,
                    e.strerror or e)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return
    log.info("kafka state kept in %s: %d producer partition(s), %d commit metadata", path,
             len(state["sequences"]), len(state["metadata"]),
             extra={"event": "kafka_state_kept", "path": path, "sequences": len(state["sequences"]),
                    "metadata": len(state["metadata"])})


def restore(listener, data_dir: str) -> None:
    """Take back the state a clean stop kept in ``data_dir``, and remove its file."""
    path = os.path.join(data_dir, FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return
    except OSError as e:
        log.warning("cannot read %s: %s; the Kafka producers start new epochs", path, e.strerror or e)
        return
    try:
        state = json.loads(raw)
        if not isinstance(state, dict) or state.get("version") != VERSION:
            raise ValueError(f"version {state.get('version') if isinstance(state, dict) else None!r}, not {VERSION}")
        seqs = listener.sequences.restore(state["sequences"], _created_at(listener))
        metas = listener.coordinator.restore_metadata(state["metadata"])
    except (ValueError, KeyError, TypeError) as e:
        aside = f"{path}.damaged"
        log.warning("%s is not a Kafka state this server wrote (%s): moved to %s; the Kafka producers start new "
                    "epochs", path, e, aside)
        os.replace(path, aside)
        return
    os.unlink(path)
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
