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

__all__ = ["DisqueDataSource"]


def __getattr__(name: str) -> Any:
    if name == "DisqueDataSource":
        from disque.spark.source import DisqueDataSource

        return DisqueDataSource
    raise AttributeError(f"module 'disque.spark' has no attribute {name!r}")
