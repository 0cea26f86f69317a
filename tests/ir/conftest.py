"""Fixtures shared by the ir tests."""
import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: fresh inputs per test, the same on every run."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
