"""shmq in Apache Spark (PySpark >= 4.2, ``pip install 'shmq[spark]'``): the data sources
"shmq" (a Structured Streaming and batch source and sink over streams and queues) and
"dmsq" (a batch reader of ``.dmsq`` snapshot files). docs/SPARK.md is the user's guide.

    import shmq.spark
    shmq.spark.register(spark)
    spark.readStream.format("shmq").option("stream", "events").load()

Module map: ``options`` (the options, read once, and the connection they name),
``schema`` (the source's columns), ``arrow`` (records as Arrow batches, both ways), ``reader`` (the source: offsets, read limits,
partitions), ``writer`` (the sink: staged batches published exactly once), ``stager``
(a work queue moved into a stream the source reads), ``dmsq_reader`` (snapshot files),
``session`` (a quiet local SparkSession for examples, benchmarks and tests).
"""

from .session import local_session

__all__ = ["register", "local_session"]


def register(spark) -> None:
    """Register the data sources "shmq" and "dmsq" in the session ``spark``; first make
    sure its Python workers can import shmq: a local session where nothing chose their
    Python (``PYSPARK_PYTHON``, ``spark.pyspark.python``) gets this interpreter, and one
    whose chosen Python cannot import shmq is refused (SpecError, one line saying how)."""
    from .datasource import ShmqDataSource
    from .dmsq_reader import DmsqDataSource
    from .session import worker_python

    worker_python(spark)
    spark.dataSource.register(ShmqDataSource)
    spark.dataSource.register(DmsqDataSource)
