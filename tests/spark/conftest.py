"""The Spark suite: one local[2] SparkSession and one disque node for all tests.

Nothing here imports pyspark at import time: the test modules skip themselves
when pyspark or pyarrow is not installed (the optional `spark` extra)."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from disque.testing.devcluster import NodeProcess, free_port
from disque.spark import _io

SPARK_TIMEOUT = 300  # s per test, session start included (JVM start is slow on a busy machine)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers need the venv's packages
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from disque.spark import local_session

    session = local_session("disque-tests", **{"spark.sql.streaming.stopTimeout": "30s"})
    yield session
    session.stop()


@pytest.fixture(scope="session")
def disque_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    node = NodeProcess(free_port(), tmp_path_factory.mktemp("disque-node")).start()
    yield node
    node.stop()


@pytest.fixture(scope="session")
def address(disque_node: NodeProcess) -> str:
    return f"{disque_node.host}:{disque_node.port}"


@pytest.fixture
def conn(address: str) -> Iterator[_io.Conn]:
    with _io.Conn(address) as c:
        yield c


@pytest.fixture
def queue_name() -> Callable[[str], str]:
    """Fresh queue names, so tests sharing the node do not see each other's jobs."""
    token = uuid.uuid4().hex[:8]
    return lambda name: f"{name}-{token}"

