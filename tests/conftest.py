"""Shared fixtures: one real Redis server and one SparkSession per test session.

- ``redis_server_url``: ``$FTLAYER_TEST_REDIS_URL`` if set (CI can point it at
  Debian's redis-server), else an embedded valkey-server started once.
- ``redis_client`` / ``namespace`` / ``ft_config``: a clean namespace per test;
  every key under it is deleted afterwards.
- ``fake_redis``: fakeredis with Lua, only for fast unit tests of single functions.
- ``spark``: one local[2,4] SparkSession (2 cores, up to 4 attempts per task).
- ``valkey_cluster``: a Valkey Cluster of 3 primaries and 3 replicas from the same
  binary, started once on first use. Tests must not kill its
  nodes; fault tests start their own ``EmbeddedCluster``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.server import EmbeddedServer


@pytest.fixture(scope="session")
def embedded_server() -> Iterator[EmbeddedServer | None]:
    if os.environ.get("FTLAYER_TEST_REDIS_URL"):
        yield None
        return
    server = EmbeddedServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server_url(embedded_server: EmbeddedServer | None) -> str:
    return os.environ.get("FTLAYER_TEST_REDIS_URL") or (embedded_server.url if embedded_server else "")


@pytest.fixture
def namespace() -> str:
    return "t" + uuid.uuid4().hex[:12]


@pytest.fixture
def redis_client(redis_server_url: str, namespace: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server_url)
    yield client
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    client.close()


@pytest.fixture
def ft_config(redis_server_url: str, namespace: str) -> FTConfig:
    return FTConfig(redis_url=redis_server_url, namespace=namespace, timeout_s=5.0, state_dir=TEMP_STATE_DIR)


@pytest.fixture
def fake_redis() -> Any:
    fakeredis = pytest.importorskip("fakeredis")
    return fakeredis.FakeRedis()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from ftlayer.errors import FTLayerError
    from runtime.spark.session import local_session

    try:
        session = local_session("ftlayer-tests")
    except FTLayerError as exc:  # java missing: say so clearly, do not skip
        pytest.fail(str(exc))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[Any]:
    from ftlayer.cluster_server import EmbeddedCluster

    cluster = EmbeddedCluster(primaries=3, replicas=1).start()
    yield cluster
    cluster.stop()
