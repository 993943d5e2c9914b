"""The limits and argument checks that the engine, the wire codec and the clients
share: each raises TypeError / ValueError in the words both transports use, before
anything is sent or changed."""

__all__ = ["MAX_PARTITIONS", "MAX_KEY_CHARS", "MAX_TXN_TIMEOUT_MS", "seconds_ns", "check_routing_key", "check_pattern",
           "check_group", "check_offset", "check_txn", "check_callback", "check_auto_commit", "check_reset",
           "check_poll_interval", "check_refresh", "MAX_STORE_KEY_CHARS", "check_store_key", "check_store_value",
           "check_ttl", "check_incr", "check_wait"]

MAX_PARTITIONS = 256  # a stream's partitions are numbered below it (engine/shm/layout.py sizes the groups' words by it)
MAX_KEY_CHARS = 255  # a routing key or a binding pattern (AMQP's short string)
MAX_TXN_TIMEOUT_MS = 900_000  # the longest a transaction may stay open (Kafka's transaction.max.timeout.ms)


def seconds_ns(value, what) -> int:
    """A timeout, delay or lease given in seconds, checked, in nanoseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if value != value or value < 0:
        raise ValueError(f"{what} must be >= 0, not {value!r}")
    return int(value * 1e9)


def _check_words(value, what) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if len(value) > MAX_KEY_CHARS:
        raise ValueError(f"{what} must be at most {MAX_KEY_CHARS} characters, not {len(value)}")
    return value


def check_routing_key(key) -> str:
    return _check_words(key, "routing_key")


def check_pattern(pattern) -> str:
    return _check_words(pattern, "pattern")


def check_group(group) -> str:
    """A consumer group's name checked: 1-126 bytes."""
    if not isinstance(group, str) or not 1 <= len(group.encode()) <= 126:
        raise ValueError(f"group must be a name of 1-126 bytes, not {group!r}")
    return group


def check_offset(o) -> int:
    if isinstance(o, bool) or not isinstance(o, int) or o < 0:
        raise ValueError(f"offsets must be ints >= 0, not {o!r}")
    return o


def check_txn(txn_id, batch: int = 0) -> bytes:
    """A publisher id (16 bytes) and batch (an int >= 0) checked: the id as bytes."""
    if not isinstance(txn_id, (bytes, bytearray, memoryview)) or len(txn_id) != 16:
        raise ValueError(f"a publisher id is 16 bytes, not {txn_id!r:.60}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0:
        raise ValueError(f"batch must be an int >= 0, not {batch!r}")
    return bytes(txn_id)


def check_callback(fn, what):
    """An on_assign / on_revoke callback checked: None or a callable of a list of partitions."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{what} must be a callable of the partitions, not {type(fn).__name__}")
    return fn


def check_auto_commit(auto_commit, interval) -> int | None:
    """auto_commit and auto_commit_interval checked: the interval in ns, None when off."""
    if not isinstance(auto_commit, bool):
        raise TypeError(f"auto_commit must be True or False, not {auto_commit!r}")
    ns = seconds_ns(interval, "auto_commit_interval")
    if not ns:
        raise ValueError(f"auto_commit_interval must be > 0, not {interval!r}")
    return ns if auto_commit else None


def check_reset(value) -> str:
    """auto_offset_reset checked."""
    if value not in ("earliest", "latest", "none"):
        raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', not {value!r}")
    return value


def check_poll_interval(value) -> int | None:
    """max_poll_interval checked: in ns, None for no bound."""
    if value is None:
        return None
    ns = seconds_ns(value, "max_poll_interval")
    if not ns:
        raise ValueError(f"max_poll_interval must be > 0 (or None: no bound), not {value!r}")
    return ns


def check_refresh(value) -> int:
    """refresh_interval (a member of several streams looking for new ones) checked, in ns."""
    ns = seconds_ns(value, "refresh_interval")
    if not ns:
        raise ValueError(f"refresh_interval must be > 0, not {value!r}")
    return ns


# ---------------------------------------------------------------- keyed stores (engine/store.py)
MAX_STORE_KEY_CHARS = 1024  # a store's key or set member: 1..1024 characters


def check_store_key(key, what="key") -> str:
    """A store's key (or set member, or key prefix: ``what``) checked: a str of
    1..MAX_STORE_KEY_CHARS characters, encodable as UTF-8."""
    if not isinstance(key, str):
        raise TypeError(f"a {what} must be a str, not {type(key).__name__}")
    if not 1 <= len(key) <= MAX_STORE_KEY_CHARS:
        raise ValueError(f"a {what} must be 1-{MAX_STORE_KEY_CHARS} characters, not {len(key)}")
    try:
        key.encode()
    except UnicodeEncodeError:
        raise ValueError(f"a {what} must be encodable as UTF-8 (no lone surrogates): {key!r:.60}") from None
    return key


def check_store_value(value) -> bytes:
    """A store's value checked: bytes (a bytearray or memoryview copied)."""
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if not isinstance(value, bytes):
        raise TypeError(f"a value must be bytes, not {type(value).__name__}")
    return value


def check_ttl(ttl, none_ok=True) -> float | None:
    """A store key's ttl checked: seconds > 0 (at most 1e9), or None (no expiry) where ``none_ok``."""
    if ttl is None and none_ok:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise TypeError(f"ttl must be a number of seconds{' or None' if none_ok else ''}, not {type(ttl).__name__}")
    if not 0 < ttl <= 1e9:  # (NaN fails too)
        raise ValueError(f"ttl must be > 0 seconds (at most 1e9), not {ttl!r}")
    return float(ttl)


def check_incr(by) -> int:
    """An incr's step checked: an int of 64 bits."""
    if isinstance(by, bool) or not isinstance(by, int):
        raise TypeError(f"by must be an int, not {type(by).__name__}")
    if not -2**63 <= by < 2**63:
        raise ValueError(f"by must fit in 64 bits, not {by}")
    return by


def check_wait(timeout) -> float:
    """A waiting read's timeout checked: seconds >= 0 (at most 1e9)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= 1e9:
        raise ValueError(f"timeout must be seconds >= 0, not {timeout!r}")
    return float(timeout)
