"""Sizes as people read them in messages: the one formatting of a byte count that errors,
``shmq doctor`` and the engine's refusals share."""

__all__ = ["size_text"]


def size_text(n: int) -> str:
    """1023 B, 1.5 KiB, 64.0 MiB, 2.3 GiB."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
