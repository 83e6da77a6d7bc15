"""Every test directory: the test's body stores are closed after it."""

from collections.abc import Iterator

import pytest

from support import close_body_stores


@pytest.fixture(autouse=True)
def closed_body_stores() -> Iterator[None]:
    yield
    close_body_stores()
