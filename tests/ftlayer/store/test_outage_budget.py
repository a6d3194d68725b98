"""The outage budget on a real server that is SIGKILLed and restarted from its AOF.

Clients built with an outage budget (Spark tasks, the FT source) retry a command with backoff
until the server answers again or the budget is spent; the FT service does the same per tick.
Every outage here lasts 3 s, well beyond redis-py's own ~0.7 s of retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import ServiceStoppedError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.servers.ports import free_port
from ftlayer.store.connection import client_for


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield srv
    srv.stop()


def _outage(server: EmbeddedServer, down_s: float) -> threading.Thread:
    """SIGKILL the server now and start it again after ``down_s`` (from another thread)."""
    server.kill()
    restart = threading.Thread(target=lambda: (time.sleep(down_s), server.start()))
    restart.start()
    return restart


@pytest.mark.slow
def test_a_budgeted_client_rides_out_a_3s_outage_a_plain_one_does_not(server: EmbeddedServer) -> None:
    budgeted = client_for(server.url, 5.0, outage_budget_s=60.0)
    plain = client_for(server.url, 5.0)
    budgeted.set("k", "v")
    restart = _outage(server, 3.0)
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):  # redis-py's own 3 retries (~0.7 s) are not enough
        plain.get("k")
    assert budgeted.get("k") == b"v"  # waited for the restart, then answered
    waited = time.monotonic() - started
    restart.join()
    print(f"budgeted GET answered after {waited:.1f} s of outage")
    assert waited >= 2.5


def test_a_budgeted_client_gives_up_when_the_budget_is_spent() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client_for(url, 1.0, check=False, outage_budget_s=1.0).ping()
    waited = time.monotonic() - started
    print(f"gave up after {waited:.1f} s (budget 1 s)")
    assert 1.0 <= waited < 30.0


@pytest.mark.slow
def test_the_ft_service_rides_out_a_3s_outage(server: EmbeddedServer) -> None:
    cfg = FTConfig(redis_url=server.url, namespace="svc", timeout_s=0.8, num_buckets=3, outage_budget_s=60.0)
    layer = FTLayer(cfg, "topo", "src").open()
    service = FTService([layer], tick_s=0.05).start()
    try:
        deadline = time.monotonic() + 30
        while service.rotations < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        _outage(server, 3.0).join()
        before = service.rotations
        deadline = time.monotonic() + 60
        while service.rotations < before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.alive and service.error is None
        assert service.rotations >= before + 3, "rotations go on after the outage"
        assert service.errors > 0, "the outage was seen"
        print(f"service errors during the outage: {service.errors}, rotations {service.rotations}")
    finally:
        service.stop()


@pytest.mark.slow
def test_the_ft_service_gives_up_after_its_outage_budget() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    cfg = FTConfig(redis_url=url, namespace="svc", timeout_s=1.0, outage_budget_s=2.0, connect_timeout_s=0.5)
    service = FTService([FTLayer(cfg, "topo", "src")], tick_s=0.05).start()
    try:
        deadline = time.monotonic() + 60
        while service.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not service.alive
        assert isinstance(service.error, ServiceStoppedError), service.error
        assert "2" in str(service.error) and "topo/src" in str(service.error)
    finally:
        service.stop()
