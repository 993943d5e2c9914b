"""The Python "shmq" data source under a second name, "shmq_python": reachable when the JVM
connector's jar (``shmq.spark.jar``) makes "shmq" the JVM source, and what that source hands
on (the sink, a queue source, subscribePattern)."""

from .datasource import ShmqDataSource

__all__ = ["PYTHON_NAME", "ShmqPythonDataSource"]

PYTHON_NAME = "shmq_python"


class ShmqPythonDataSource(ShmqDataSource):
    """``format("shmq_python")``: the Python source and sink, whichever serves "shmq"."""

    @classmethod
    def name(cls):
        return PYTHON_NAME
