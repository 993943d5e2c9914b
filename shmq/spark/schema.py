"""The "shmq" source's columns as Spark DDL (Kafka's source's, with ``stream`` for topic):
apart from ``arrow``, so the processes that only plan a query (Spark starts one per
query) never import pyarrow."""

__all__ = ["SOURCE_FIELDS", "source_schema"]

SOURCE_FIELDS = "key binary, value binary, stream string, partition int, offset long, timestamp timestamp"


def source_schema(include_headers: bool) -> str:
    """The source's columns; with ``includeHeaders``, ``headers`` map<string,string> too."""
    return SOURCE_FIELDS + (", headers map<string,string>" if include_headers else "")
