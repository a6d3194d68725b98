"""'waitaof' durability: persist returns only once the server confirms the AOF fsync.

Each test needs the wait itself: a server told ``appendfsync no`` after open
never confirms an fsync on its own, so a persist that did not wait for WAITAOF
would return at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import DurabilityError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from serialization.serializers import make_record


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(data_dir=tmp_path, appendfsync="always").start()
    yield srv
    srv.stop()


def _open(server: EmbeddedServer, timeout_ms: int) -> tuple[FTLayer, redis.Redis]:
    cfg = FTConfig(redis_url=server.url, namespace="dur", durability="waitaof", waitaof_timeout_ms=timeout_ms)
    layer = FTLayer(cfg, "topo", "src", num_channels=2).open()
    admin = redis.Redis.from_url(server.url)
    admin.config_set("appendfsync", "no")  # from now on the server confirms no fsync by itself
    return layer, admin


@pytest.mark.slow
def test_persist_returns_only_after_the_server_confirms_the_fsync(server: EmbeddedServer) -> None:
    layer, admin = _open(server, timeout_ms=120_000)
    recs = [make_record(layer, i) for i in range(500)]
    box: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: box.update(n=layer.persist(recs)), daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    def filed() -> int:
        return int(admin.get(layer.store.keys.live) or 0)

    while filed() < 500 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert filed() == 500  # the write itself went through
    worker.join(3.0)
    assert worker.is_alive(), "persist returned before WAITAOF confirmed the fsync"
    admin.config_set("appendfsync", "always")  # the next event-loop turn confirms the fsync
    worker.join(60)
    assert not worker.is_alive() and box["n"] == 500
    print(f"\npersist blocked >= 3 s on WAITAOF with appendfsync no; returned {box['n']} once fsync was on")


def test_a_waitaof_timeout_reaches_the_caller_as_durability_error(server: EmbeddedServer) -> None:
    layer, _admin = _open(server, timeout_ms=300)
    with pytest.raises(DurabilityError, match="waitaof_timeout_ms") as info:
        layer.persist([make_record(layer, i) for i in range(10)])
    assert 'durability = "waitaof"' in str(info.value)
    assert layer.pending_count() == 10  # written, only its fsync is unconfirmed: nothing is dropped
