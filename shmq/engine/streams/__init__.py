"""Streams: partitioned append-only logs (``stream``, one ``partition`` each), their bulk
paths (``paths``: C's or Python's, bound as a stream attaches), key routing
(``partitioner``), consumer groups (``groups``), one member over several streams
(``multiconsumer``) and the wait on any of them (``watch``)."""
