"""Streams: partitioned append-only logs (``stream``, one ``partition`` each), key
routing (``partitioner``), consumer groups (``groups``), one member over several
streams (``multiconsumer``) and the wait on any of them (``watch``)."""
