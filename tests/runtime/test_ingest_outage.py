"""Ingest through Redis outages on a real server that is SIGKILLed and restarted from its AOF.

The server runs with ``appendfsync always`` so that a kill loses nothing acknowledged: every
record the source produced must then be persisted exactly once, whatever the outage did.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from runtime.chaos.procs import pending_ids
from runtime.driver.ingest import Ingestor
from runtime.testing import EOF, Emit, Pause, ScriptedSource, Step


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield srv
    srv.stop()


def _paced(records: int, step: int, pause_s: float) -> list[Step]:
    script: list[Step] = []
    for _ in range(0, records, step):
        script += [Emit(step), Pause(pause_s)]
    return [*script, EOF]


def _wait(cond: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow
def test_ingest_pauses_through_an_outage_and_resumes(server: EmbeddedServer) -> None:
    """An outage longer than redis-py's own ~0.7 s of retries (ingest pauses only once they are
    spent): ingest pauses, resumes when the server is back, and persists every record the source
    produced, before and after the outage."""
    cfg = FTConfig(redis_url=server.url, namespace="outage", durability="waitaof", flush_batch_size=50)
    layer = FTLayer(cfg, "ing", "outage", num_channels=2).open()
    source = ScriptedSource(_paced(2000, 50, 0.05), chunk=50)
    ing = Ingestor(layer, source, linger_s=0.005).start()
    try:
        _wait(lambda: layer.stats()["persisted"] >= 400, 60, "400 records persisted")
        server.kill()
        # ingest reports that it is paused during the outage
        _wait(lambda: (ing.paused or "").startswith("outage"), 60, "ingest to pause on the outage")
        assert not ing.done, "ingest must wait for the server, not stop"
        server.start()
        _wait(lambda: ing.done, 120, "ingest to finish after the outage")
    finally:
        ing.stop()
    assert ing.error is None, ing.error
    assert ing.pauses >= 1 and ing.paused is None
    st = layer.stats()
    print(f"produced {source.emitted}, persisted {st['persisted']}, ingest pauses {ing.pauses}")
    assert source.emitted == ing.ingested == st["persisted"] == 2000
    assert sorted(pending_ids(layer)) == list(range(2000))


def test_stop_during_an_outage_shorter_than_the_grace_still_persists_the_batch_in_hand(
        server: EmbeddedServer) -> None:
    """stop() while the server is down: the batch in hand is retried for stop_grace_s, so a
    restart within it persists every record the source produced (a query restarted during a
    failover stops its ingest threads this way)."""
    cfg = FTConfig(redis_url=server.url, namespace="grace", durability="waitaof", flush_batch_size=50)
    layer = FTLayer(cfg, "ing", "grace", num_channels=2).open()
    source = ScriptedSource(_paced(10_000, 50, 0.02), chunk=50)
    ing = Ingestor(layer, source, linger_s=0.005).start()
    try:
        _wait(lambda: layer.stats()["persisted"] >= 200, 60, "200 records persisted")
        server.kill()
        _wait(lambda: (ing.paused or "").startswith("outage"), 60, "ingest to pause on the outage")
        ing.request_stop()
        time.sleep(2.0)  # the outage outlasts redis-py's own retries (~0.7 s) after the stop
        assert not ing.done, "the batch in hand must be retried, not abandoned at once"
        server.start()
        ing.stop(30.0)
        assert ing.done
    finally:
        ing.stop()
    st = layer.stats()
    print(f"produced {source.emitted}, persisted {st['persisted']}, abandoned {ing.abandoned}")
    assert ing.abandoned == 0 and ing.error is None
    assert source.emitted == ing.ingested == st["persisted"]
    assert sorted(pending_ids(layer)) == list(range(source.emitted))


def test_stop_during_an_outage_longer_than_the_grace_abandons_and_counts_the_batch(
        server: EmbeddedServer) -> None:
    cfg = FTConfig(redis_url=server.url, namespace="nograce", durability="waitaof", flush_batch_size=50)
    layer = FTLayer(cfg, "ing", "nograce", num_channels=2).open()
    source = ScriptedSource(_paced(10_000, 50, 0.02), chunk=50)
    ing = Ingestor(layer, source, linger_s=0.005)
    ing.stop_grace_s = 0.5
    ing.start()
    try:
        _wait(lambda: layer.stats()["persisted"] >= 200, 60, "200 records persisted")
        server.kill()
        _wait(lambda: (ing.paused or "").startswith("outage"), 60, "ingest to pause on the outage")
        ing.stop(30.0)
        assert ing.done
    finally:
        server.start()
    st = layer.stats()
    assert ing.abandoned > 0
    assert source.emitted == st["persisted"] + ing.abandoned
