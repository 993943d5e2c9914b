"""Queues: one named queue's operations (``queue``) in the modules that hold them —
``produce``, ``consume``, ``settle``, ``reserve``, ``delivery``, ``paths`` (the hot
paths a handle runs, C's or Python's, bound as it attaches), ``extension`` (a
record's per-message options), ``scheduling`` (priorities, delays), ``lanes``,
``deadletter``, ``dedup``, ``housekeeping`` (lapsed leases, due messages), and the
routing and request/reply on top: ``exchange``, ``rpc``, ``serialized``."""
