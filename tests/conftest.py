"""Fixtures shared by several test modules."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Small problems: extra threads only add synchronization overhead on 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
