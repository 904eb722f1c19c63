"""Shared fixtures of the torch.nn layers' tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny tensors on one torch thread: on a busy machine, handing each tiny op to a second
    thread made the layers' grids ~15 times slower; what they test does not depend on threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
