"""Spark connector: `DisqueDataSource`, a Python data source named "disque".

Install with `pip install 'disque[spark]'` (pyspark 4.x and pyarrow), then::

    from disque.spark import DisqueDataSource
    spark.dataSource.register(DisqueDataSource)
    spark.read.format("disque").option("nodes", "127.0.0.1:7711").load()

Importing `disque.spark` does not import pyspark: the data source is loaded
on first access, so the pure parts (`disque.spark.logic`) work without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DisqueDataSource", "local_session"]

# Settings for a small local[2] session on loopback (tests, examples, benchmarks).
LOCAL_SETTINGS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


def local_session(app_name: str, **extra: str) -> Any:
    """A local[2] SparkSession with the "disque" source registered.  Workers
    run this interpreter, so they see the same installed packages."""
    import os
    import sys

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from disque.spark.source import DisqueDataSource

    builder = SparkSession.builder.master("local[2]").appName(app_name)
    for key, value in {**LOCAL_SETTINGS, **extra}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DisqueDataSource)
    return spark


def __getattr__(name: str) -> Any:
    if name == "DisqueDataSource":
        from disque.spark.source import DisqueDataSource

        return DisqueDataSource
    raise AttributeError(f"module 'disque.spark' has no attribute {name!r}")
