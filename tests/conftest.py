"""Shared fixtures: one real Redis server and one SparkSession per test session.

- ``redis_server_url``: ``$FTLAYER_TEST_REDIS_URL`` if set (CI can point it at
  Debian's redis-server), else an embedded valkey-server started once.
- ``redis_client`` / ``namespace`` / ``ft_config``: a clean namespace per test;
  every key under it is deleted afterwards.
- ``fake_redis``: fakeredis with Lua, only for fast unit tests of single functions.
- ``spark``: one local[2,4] SparkSession (2 cores, up to 4 attempts per task).
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
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
    return FTConfig(redis_url=redis_server_url, namespace=namespace, timeout_s=5.0)


@pytest.fixture
def fake_redis() -> Any:
    fakeredis = pytest.importorskip("fakeredis")
    return fakeredis.FakeRedis()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if shutil.which("java") is None:
        pytest.fail("java is not on PATH: Spark 4.x needs Java 17 or 21 (apt-get install openjdk-17-jre-headless)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("ftlayer-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
