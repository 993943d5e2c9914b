"""What a handle shows of its object's settings, on either transport and the local
asyncio face alike."""

__all__ = ["STREAM_INFO"]

# a stream's settings, as STREAM_CREATE and STREAM_INFO replies give them (and a handle has them)
STREAM_INFO = ("partitions", "max_bytes", "max_message_bytes", "retention", "retention_bytes", "retention_seconds",
               "group_idle_timeout", "durability", "created_at", "compact")
