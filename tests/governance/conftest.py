import pytest

from ratchet import tables


@pytest.fixture
def con(wh):
    """A connection to a fresh warehouse with every layer's tables."""
    with wh.connect() as c:
        tables.ensure_all(c)
        yield c
