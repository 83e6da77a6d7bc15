"""Spark connector: `DisqueDataSource`, a Python data source named "disque".

Needs the `spark` extra (pyspark 4.x and pyarrow; in a checkout, `make
extras EXTRAS=spark`), then::

    from disque.spark import DisqueDataSource
    spark.dataSource.register(DisqueDataSource)
    spark.read.format("disque").option("nodes", "127.0.0.1:7711").load()

Importing `disque.spark` does not import pyspark: the data source is loaded
on first access, so the pure parts (`disque.spark.logic`) work without it.

Spark runs the data source in Python worker processes started with
PYSPARK_PYTHON, by default `python3` from PATH, which may well lack this
package (a venv not activated): the workers then fail with
`ModuleNotFoundError: No module named 'disque'`.  So importing
`disque.spark` makes them run this interpreter, unless PYSPARK_PYTHON is
set (spark-submit sets it from `spark.pyspark.python`).
"""

from __future__ import annotations

import os
import sys
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


def workers_run_this_python() -> None:
    """PYSPARK_PYTHON (Spark's Python workers) = this interpreter, unless the
    user chose one; a SparkContext started before this import read the
    variable already, so its interpreter is switched too if it is Spark's
    default."""
    if os.environ.get("PYSPARK_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    context = sys.modules.get("pyspark.core.context")  # never imported here: only a loaded pyspark can have one
    active = getattr(getattr(context, "SparkContext", None), "_active_spark_context", None)
    if active is not None and active.pythonExec == "python3":
        active.pythonExec = sys.executable


workers_run_this_python()


def local_session(app_name: str, **extra: str) -> Any:
    """A local[2] SparkSession with the "disque" source registered."""
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
