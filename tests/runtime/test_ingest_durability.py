"""Ingest in 'waitaof' mode: a WAITAOF timeout stops ingest with the error; it never loops."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from ftlayer.config import FTConfig
from ftlayer.errors import DurabilityError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from runtime.driver.ingest import Ingestor


def test_a_waitaof_timeout_stops_ingest_with_the_error_and_persists_nothing_twice(tmp_path: Path) -> None:
    server = EmbeddedServer(data_dir=tmp_path, appendfsync="always").start()
    try:
        cfg = FTConfig(redis_url=server.url, namespace="dur", durability="waitaof", waitaof_timeout_ms=200)
        layer = FTLayer(cfg, "ing", "src", num_channels=2).open()
        redis.Redis.from_url(server.url).config_set("appendfsync", "no")  # no fsync is confirmed any more
        ing = Ingestor(layer, [{"i": i} for i in range(50)] + [{"i": i} for i in range(50, 80)]).start()
        deadline = time.monotonic() + 30
        while not ing.done and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = layer.stats()
        print(f"\ningest done={ing.done} error={type(ing.error).__name__} persisted={stats['persisted']}")
        assert ing.done, "ingest kept retrying a WAITAOF timeout"
        assert isinstance(ing.error, DurabilityError) and "waitaof_timeout_ms" in str(ing.error)
        # the batch reached the server once; nothing was persisted again under new ids
        assert stats["persisted"] == layer.pending_count() <= 80
        assert ing.abandoned == 0
        ing.stop()
    finally:
        server.stop()
