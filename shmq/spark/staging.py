"""Where a Spark sink stages a batch before it publishes it (``writer``): a stream named
``NAME:staging:WRITER`` beside the target NAME, WRITER being the streaming query's id
(or a batch write's job id), there from a batch's first staged row to its commit. This
module needs no Spark: the CLI reads it to show what is staged."""

__all__ = ["STAGING", "staging_name", "staged_by_writer"]

STAGING = ":staging:"


def staging_name(stream: str, writer_id: str) -> str:
    return f"{stream}{STAGING}{writer_id}"


def staged_by_writer(broker, stream: str, names) -> dict:
    """{writer id: records staged and not yet published} for ``stream``, among the
    stream ``names`` of ``broker``: the batches being written now, and those of queries
    killed in the middle of one (docs/SPARK.md says how to reclaim them)."""
    out = {}
    prefix = stream + STAGING
    for name in names:
        if name.startswith(prefix):
            with broker.stream(name) as st:
                out[name[len(prefix):]] = sum(part["end"] - part["earliest"] for part in st.stats()["partitions"])
    return out
