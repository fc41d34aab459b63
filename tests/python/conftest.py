"""Fixtures shared by the tilelab Python tests."""

import numpy as np
import pytest

import tilelab


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


@pytest.fixture
def restore_num_threads():
    """Tests that change the thread count leave it as they found it."""
    before = tilelab.num_threads()
    yield
    tilelab.set_num_threads(before)
