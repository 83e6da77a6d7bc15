"""Auto-registration of the Disque data source.

Spark looks for top-level modules named `pyspark_*` exposing `DefaultSource`
and registers them under their `name()`, so with this module installed
`spark.read.format("disque")` works without `spark.dataSource.register`.
"""

from disque.spark.source import DisqueDataSource

DefaultSource = DisqueDataSource

__all__ = ["DefaultSource", "DisqueDataSource"]
