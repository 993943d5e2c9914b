"""A transaction's control records in Kafka's batch format: the attribute bits of a
transactional and of a control batch, and a COMMIT or ABORT marker's key and value.

Strategy: what the transaction coordinator writes into a partition, apart from the
batch codec (``records``), so that a DEADBEEF server's transactions need none of the
``kafka`` extra (kio, crc32c, the codecs).
"""

import struct

__all__ = ["TRANSACTIONAL", "CONTROL", "ABORT", "COMMIT", "marker"]

TRANSACTIONAL, CONTROL = 0x10, 0x20  # a batch's attribute bits
# a transaction marker: a control batch of one record, its key the control type
# (version int16 0, type int16), its value the end-transaction marker (version int16 0,
# coordinator epoch int32)
ABORT, COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


def marker(commit: bool) -> tuple[bytes, bytes]:
    """(key, value) of the record of a COMMIT or ABORT marker."""
    return _CONTROL_KEY.pack(0, COMMIT if commit else ABORT), _MARKER_VALUE.pack(0, 0)
