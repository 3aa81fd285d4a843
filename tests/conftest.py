"""Fixtures shared by several test modules."""

import os

# The Trainer's thread policy picks its intra-op threads from the machine's load, and the
# thread count changes the last bits of a reduction. Tests that compare two runs bit for
# bit (exact resume after SIGKILL, in this process and in subprocesses, which inherit the
# environment) need the same count in both runs whatever else the machine is doing: one.
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """Small problems: extra threads only add synchronization overhead on 2 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
