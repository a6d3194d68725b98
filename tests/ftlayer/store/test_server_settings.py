"""open() refuses a server whose settings break ftlayer's promises (real valkey-server per test)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import DurabilityError, EvictionPolicyError, ServerSettingsError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from serialization.serializers import make_record


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[type[EmbeddedServer]]:
    started: list[EmbeddedServer] = []

    def start(*args: str, appendfsync: str = "everysec") -> EmbeddedServer:
        server = EmbeddedServer(tmp_path / str(len(started)), appendfsync=appendfsync, extra_args=args).start()
        started.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in started:
        server.stop()


@pytest.mark.parametrize(
    "policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-ttl"]
)
def test_open_refuses_an_evicting_maxmemory_policy(start_server, policy: str) -> None:  # type: ignore[no-untyped-def]
    server = start_server("--maxmemory", "64mb", "--maxmemory-policy", policy)
    cfg = FTConfig(redis_url=server.url, namespace="ev")
    with pytest.raises(EvictionPolicyError) as info:
        FTLayer(cfg, "topo", "src", num_channels=2).open()
    text = str(info.value)
    assert isinstance(info.value, ServerSettingsError)
    assert "maxmemory-policy" in text and policy in text and "CONFIG SET maxmemory-policy noeviction" in text
    # refused before anything was written
    assert redis.Redis.from_url(server.url).dbsize() == 0


def test_open_accepts_noeviction(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server("--maxmemory", "64mb", "--maxmemory-policy", "noeviction")
    layer = FTLayer(FTConfig(redis_url=server.url, namespace="ev"), "topo", "src", num_channels=2).open()
    assert layer.persist([make_record(layer, 1)]) == 1


def test_waitaof_against_a_server_without_aof_fails_at_open(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server("--appendonly", "no")
    cfg = FTConfig(redis_url=server.url, namespace="dur", durability="waitaof")
    with pytest.raises(DurabilityError, match=r"durability = \"waitaof\".*appendonly") as info:
        FTLayer(cfg, "topo", "src", num_channels=2).open()
    assert "CONFIG SET appendonly yes" in str(info.value)
    # the other modes make no fsync promise that the server could break at open
    FTLayer(cfg.replace(durability="everysec"), "topo", "src", num_channels=2).open()


def test_waitaof_against_appendfsync_no_fails_at_open(start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(appendfsync="no")
    cfg = FTConfig(redis_url=server.url, namespace="dur", durability="waitaof")
    with pytest.raises(DurabilityError, match="appendfsync"):
        FTLayer(cfg, "topo", "src", num_channels=2).open()
