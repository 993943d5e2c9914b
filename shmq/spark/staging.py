"""Where a Spark sink stages a batch before it publishes it (``writer``): a stream named
``NAME:staging:WRITER`` beside the target NAME, WRITER being the streaming query's id
(or a batch write's job id). This module needs no Spark: the CLI reads it to show what
is staged."""

__all__ = ["STAGING", "staging_name", "staged_by_writer", "reclaim"]

STAGING = ":staging:"


def staging_name(stream: str, writer_id: str) -> str:
    return f"{stream}{STAGING}{writer_id}"


def staged_by_writer(broker, stream: str, names) -> dict:
    """{writer id: records staged and not yet reclaimed} for ``stream``, among the
    stream ``names`` of ``broker``."""
    out = {}
    prefix = stream + STAGING
    for name in names:
        if name.startswith(prefix):
            with broker.stream(name) as st:
                out[name[len(prefix):]] = sum(part["end"] - part["earliest"] for part in st.stats()["partitions"])
    return out


def reclaim(staging) -> int:
    """Trim a staging stream to its end; returns how many staged records went."""
    return staging.delete_records({p: staging.offsets(p)[1] for p in range(staging.partitions)})
