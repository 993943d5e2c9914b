"""The sink's Arrow paths on a stream's own paths (``PartitionPaths``): C's and Python's
route the same rows to the same partitions, and a stream attached on the Python paths
takes the sink's chunks through ``append`` with the same result."""

import pyarrow as pa
import pytest

from shmq.engine.shm import cpaths
from shmq.engine.streams import paths as stream_paths
from shmq.engine.streams.partitioner import partition_of
from shmq.spark import arrow

KINDS = [pytest.param("c", marks=pytest.mark.skipif(not cpaths.FAST, reason="the C hot paths are off")), "python"]


def _batch(n=40):
    keys = [None if i % 5 == 0 else b"key-%d" % i for i in range(n)]
    return pa.RecordBatch.from_pydict({"key": pa.array(keys, pa.binary()), "value": [b"v%d" % i for i in range(n)]})


@pytest.mark.parametrize("kind", KINDS)
def test_the_sink_routes_and_appends_on_the_streams_paths(broker, kind):
    cpaths.set_enabled(kind == "c")
    try:
        s = broker.create_stream("s", partitions=4)
    finally:
        cpaths.set_enabled(True)
    assert s.paths.kind == kind and s._part(3).paths is s.paths
    batch = _batch()
    routed = arrow.route(batch, 4, 1, "s", s.paths)
    keys = batch.column(0).to_pylist()
    want = {}
    for i, k in enumerate(keys):
        want.setdefault(1 if k is None else partition_of(k, 4), []).append((k, b"v%d" % i))
    assert {p: list(zip(ks.to_pylist(), vs.to_pylist())) for p, vs, ks, _hs in routed} == want
    for p, values, ks, hs in routed:
        chunk = arrow.chunk(values, ks, hs)
        assert s.append_columns(chunk, p) == 0
    assert s._part(0).read_columns(0, 100) is None if kind == "python" else s._part(0).read_columns(0, 100)[0] == len(
        want[0])
    assert {p: [(r.key, r.value) for r in s.read(p, 0, max_records=100)] for p in want} == want
    s.close()


def test_the_python_paths_route_with_the_python_hash():
    assert stream_paths.PYTHON.key_partitions is None and stream_paths.PYTHON.kind == "python"
    routed = {p: vs.to_pylist() for p, vs, _ks, _hs in arrow.route(_batch(), 4, 1, "s", stream_paths.PYTHON)}
    if stream_paths.C is not None:
        assert {p: vs.to_pylist() for p, vs, _ks, _hs in arrow.route(_batch(), 4, 1, "s", stream_paths.C)} == routed
