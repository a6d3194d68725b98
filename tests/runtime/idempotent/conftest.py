"""Each test of an effectively-once sink uses its own table (the server: ``postgres`` in tests/conftest.py)."""

from __future__ import annotations

import uuid

import pytest


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:12]
