"""The "shmq" data source: one class Spark instantiates per query with its options, and
hands out the source (``reader``) and the sink (``writer``) parts. Each part is imported
when it is asked for, and pyarrow only where rows move (``read``, ``write``): Spark
starts a new Python process per query to plan it, and every import is part of the
query's start."""

from pyspark.sql.datasource import DataSource

from .options import Options
from .schema import source_schema

__all__ = ["ShmqDataSource"]


class ShmqDataSource(DataSource):
    """``format("shmq")``: a stream (or a work queue, through a stream that stages it) as
    a streaming or batch source; a stream (or a queue) as a streaming or batch sink."""

    @classmethod
    def name(cls):
        return "shmq"

    def schema(self):
        return source_schema(Options(self.options).flag("includeHeaders", False))

    def reader(self, schema):
        from .reader import BatchReader
        return BatchReader(Options(self.options), schema)

    def streamReader(self, schema):
        from .reader import StreamReader
        return StreamReader(Options(self.options), schema)

    def writer(self, schema, overwrite):
        from .writer import BatchWriter
        return BatchWriter(Options(self.options), schema, overwrite)

    def streamWriter(self, schema, overwrite):
        from .writer import StreamWriter
        return StreamWriter(Options(self.options), schema, overwrite)
