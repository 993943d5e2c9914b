"""The transaction coordinator's journal (of Kafka producers' transactions and native
ones'; the name is from when only Kafka's had them), ``kafka-txns.log`` (0600) in the data
dir (a server without one keeps it beside the namespace's shared memory, whose streams it
speaks of: ``/dev/shm/shmq.NS.kafka-txns``): one JSON array per line, each an event of the
transaction coordinator (``server/transactions/coordinator.py`` says which), appended as it
happens, so a server killed at any point finds every transaction it knew of, and where it
stood, at its next start.

Strategy: an event is one ``write`` of one whole line to a file opened for appending, before
the coordinator answers the request that made it: a process killed after the write leaves
it in the page cache, which the next start reads; a process killed during the write leaves
at most a torn last line, which a read drops (it was never answered). A server with a data
dir fsyncs it as its logs (``--fsync``: each event before its answer, within the batch's
milliseconds, or never). Each start, and each time the file outgrows ``COMPACT_BYTES``,
the coordinator writes what it holds as a new file of fewer events and renames it over the
old one (temp file, fsync, rename).
"""

import json
import os

from ..engine.shm.names import kafka_journal_entry
from ..engine.shm.segment import SHM_DIR
from .files import KAFKA_TXNS_FILE, write_atomically

__all__ = ["VERSION", "RUNTIME_ENTRY", "journal_path", "runtime_journal_path", "Journal", "read_journal",
           "set_aside_journal"]

VERSION = 1
COMPACT_BYTES = 16 * 2**20  # a journal past this is written anew, of what still matters


RUNTIME_ENTRY = "kafka-txns"  # /dev/shm/shmq.NS.kafka-txns: the journal of a server without a data dir


def journal_path(data_dir: str) -> str:
    return os.path.join(data_dir, KAFKA_TXNS_FILE)


def runtime_journal_path(namespace: str) -> str:
    """The journal of a server of ``namespace`` without a data dir: one of the namespace's
    entries in /dev/shm, gone with its shared memory (a reboot, ``namespace destroy``)."""
    return os.path.join(SHM_DIR, kafka_journal_entry(namespace))


def _line(event) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def read_journal(path: str) -> list | None:
    """The events in the journal at ``path``, in order (None: no file); a torn last line is
    dropped. OSError when it cannot be read, ValueError when it is not a journal of this
    version."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    lines = raw.split(b"\n")
    if lines and not raw.endswith(b"\n"):
        lines.pop()  # torn: its request was never answered
    events = [json.loads(x) for x in lines if x]
    if not events or events[0] != ["version", VERSION]:
        raise ValueError(f"the first line is {events[0] if events else None!r}, not {['version', VERSION]!r}")
    for e in events:
        if not isinstance(e, list) or not e or not isinstance(e[0], str):
            raise ValueError(f"an event {e!r:.80}")
    return events[1:]


def set_aside_journal(path: str) -> str:
    """Move a damaged journal aside (``.damaged``); returns where it went."""
    aside = f"{path}.damaged"
    os.replace(path, aside)
    return aside


class Journal:
    """The journal at ``path``, written anew with ``events`` (atomically), then open for
    appending. OSError as it comes."""

    def __init__(self, path: str, events):
        self.path = path
        self.fd = -1
        self.bytes = 0
        self.unsynced = False  # written since the last fsync
        self.rewrite(events)

    def rewrite(self, events) -> None:
        """Replace the file by one of ``events``, and append to that one from now on."""
        data = b"".join(map(_line, [["version", VERSION], *events]))
        write_atomically(self.path, data)
        self.close()
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
        self.bytes = len(data)

    def write(self, event) -> None:
        """Append one event (a list of JSON values), in one write."""
        line = _line(event)
        os.write(self.fd, line)
        self.bytes += len(line)
        self.unsynced = True

    def sync(self) -> None:
        """fsync what was written (OSError as it comes)."""
        if self.fd >= 0 and self.unsynced:
            self.unsynced = False
            os.fsync(self.fd)

    @property
    def due(self) -> bool:
        """Whether the file has grown past ``COMPACT_BYTES``."""
        return self.bytes > COMPACT_BYTES

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
