"""Shared fixtures of the engine's tests."""

import pytest

from .reference import attention_data


@pytest.fixture(scope="module")
def data():
    """:func:`attention_data`: queries, keys, values and a log-prior."""
    return attention_data()
