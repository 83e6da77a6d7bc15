"""Every test directory: the test's body stores are closed after it, and
tests marked `slow` are skipped unless asked for (`--runslow`, DISQUE_SLOW=1,
or a `-m` expression naming `slow`, as `make test-slow` does):
docs/running.md, "Testing"."""

import os
from collections.abc import Iterator

import pytest

from support import close_body_stores


@pytest.fixture(autouse=True)
def closed_body_stores() -> Iterator[None]:
    yield
    close_body_stores()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="run the tests marked slow too (DISQUE_SLOW=1 does the same)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow") or os.environ.get("DISQUE_SLOW") or "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow, DISQUE_SLOW=1 or `make test-slow`")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)
