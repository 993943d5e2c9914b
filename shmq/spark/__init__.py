"""shmq in Apache Spark (PySpark >= 4.2, ``pip install 'shmq[spark]'``): the data sources
"shmq" (a Structured Streaming and batch source and sink over streams and queues) and
"dmsq" (a batch reader of ``.dmsq`` snapshot files). docs/SPARK.md is the user's guide.

    import shmq.spark
    spark = SparkSession.builder.config("spark.jars", shmq.spark.jar() or "").getOrCreate()
    shmq.spark.register(spark)
    spark.readStream.format("shmq").option("stream", "events").load()

With the connector's jar on Spark's class path (``jar()``: built from ``jvm/`` with the JDK),
"shmq" reads streams in the JVM; the Python source is "shmq_python" and serves the sink.

Module map: ``options`` (the options, read once, and the connection they name),
``schema`` (the source's columns), ``arrow`` (records as Arrow batches, both ways), ``reader`` (the source: offsets, read limits,
partitions), ``writer`` (the sink: staged batches published exactly once), ``stager``
(a work queue moved into a stream the source reads), ``dmsq_reader`` (snapshot files),
``session`` (a quiet local SparkSession for examples, benchmarks and tests), ``jar`` (the
JVM connector's jar), ``python_source`` (the Python source's second name).
"""

from .jar import jar
from .session import local_session

__all__ = ["register", "local_session", "jar"]


def register(spark) -> None:
    """Register the data sources "shmq" and "dmsq" in the session ``spark``, the Python
    "shmq" also as "shmq_python" (where the JVM connector's jar is on Spark's class path,
    "shmq" is its JVM source and sink); first make sure its Python workers can import
    shmq: a local session where nothing chose their Python (``PYSPARK_PYTHON``,
    ``spark.pyspark.python``) gets this interpreter, and one whose chosen Python cannot
    import shmq is refused (SpecError, one line saying how). That Python is also the JVM
    sink's publisher's (``spark.shmq.python``)."""
    from .datasource import ShmqDataSource
    from .dmsq_reader import DmsqDataSource
    from .python_source import ShmqPythonDataSource
    from .session import worker_python

    python = worker_python(spark)
    if python is not None:
        spark.conf.set("spark.shmq.python", python)
    spark.dataSource.register(ShmqPythonDataSource)
    spark.dataSource.register(DmsqDataSource)
    try:
        spark.dataSource.register(ShmqDataSource)
    except Exception as e:  # pyspark's AnalysisException, imported with pyspark only
        if getattr(e, "getCondition", lambda: None)() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
        # the JVM connector's jar is on the class path: "shmq" is its JVM source (docs/SPARK.md)
