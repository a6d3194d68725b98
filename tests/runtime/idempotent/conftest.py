"""One real PostgreSQL server per test session (``EmbeddedPostgres``); each test uses its own table."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from runtime.idempotent.pg_embedded import EmbeddedPostgres


@pytest.fixture(scope="session")
def postgres() -> Iterator[EmbeddedPostgres]:
    # a temporary directory under /tmp, not tmp_path: under root the server runs as another user,
    # who cannot enter pytest's 0700 base directory
    server = EmbeddedPostgres().start()
    yield server
    server.stop()


@pytest.fixture
def table() -> str:
    return "t_" + uuid.uuid4().hex[:12]
