"""The webhook source on a real server: 2xx only after persist, 503 + Retry-After during an outage
or under backpressure, and the source's ack hook called with exactly what was persisted."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from runtime.chaos.procs import pending_ids
from runtime.chaos.webhook_client import RetryingClient, post
from runtime.driver.ingest import Ingestor
from runtime.driver.webhook import WebhookSource
from runtime.testing import EOF, Emit, ScriptedSource


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield srv
    srv.stop()


def _user(e: dict[str, Any]) -> str:
    return str(e["user"])


def _wait(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


class AckingSource(ScriptedSource):
    """A ScriptedSource that records what ingest acked, and what was pending in Redis at that moment."""

    def __init__(self, layer: FTLayer, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.layer = layer
        self.acked: list[int] = []
        self.unpersisted_at_ack: list[int] = []

    def ack(self, values: list[Any]) -> None:
        ids = [v["i"] for v in values]
        self.unpersisted_at_ack += sorted(set(ids) - set(pending_ids(self.layer)))
        self.acked += ids


def test_ack_hook_gets_every_value_once_in_order_after_persist(ft_config: FTConfig) -> None:
    layer = FTLayer(ft_config.replace(flush_batch_size=64), "hook", "src", num_channels=2).open()
    source = AckingSource(layer, [Emit(300), EOF], chunk=50)
    Ingestor(layer, source, key=_user).run()
    assert source.acked == list(range(300))
    assert source.unpersisted_at_ack == []  # every acked value was in Redis when acked


@pytest.mark.slow
def test_webhook_answers_2xx_only_after_persist_and_503_during_an_outage(server: EmbeddedServer) -> None:
    cfg = FTConfig(redis_url=server.url, namespace="hook", durability="waitaof")
    layer = FTLayer(cfg, "hook", "web", num_channels=2).open()
    hooks = WebhookSource(reply_timeout_s=5.0, retry_after_s=1)
    ing = Ingestor(layer, hooks, key=_user).start()
    try:
        for i in range(20):
            assert post(hooks.url, {"i": i, "user": f"u{i % 3}"}) == (200, None)
        assert sorted(pending_ids(layer)) == list(range(20))
        assert post(hooks.url + "batch", [{"i": 20, "user": "a"}, {"i": 21, "user": "b"}]) == (200, None)

        # the server is frozen: the record cannot be persisted, so no 2xx can come
        os.kill(server.pid or 0, signal.SIGSTOP)
        answer: list[Any] = []
        frozen = threading.Thread(target=lambda: answer.append(post(hooks.url, {"i": 22, "user": "c"})))
        try:
            frozen.start()
            frozen.join(2.0)
            assert frozen.is_alive() and answer == [], "a 2xx before the record was persisted"
        finally:
            os.kill(server.pid or 0, signal.SIGCONT)
        frozen.join(30)
        assert answer == [(200, None)]

        # the server is down for 3 s: ingest pauses and new requests get 503 with Retry-After
        server.kill()
        down_at = time.monotonic()
        client = RetryingClient(hooks.url, [{"i": i, "user": f"u{i % 5}"} for i in range(23, 63)], threads=3).start()
        _wait(lambda: client.answers.get(503, 0) >= 3, 60, "503 answers during the outage")
        assert ing.paused is not None and "outage" in ing.paused
        status, retry_after = post(hooks.url, {"i": 999, "user": "x"})
        assert (status, retry_after) == (503, 1.0)
        time.sleep(max(0.0, down_at + 3.0 - time.monotonic()))  # an outage of at least 3 s
        server.start()
        assert client.join(120), "every record confirmed after the outage"
        print(f"answers during the test: {client.answers}, retries {client.retries}")
        assert sorted(client.confirmed) == list(range(23, 63))
        assert set(range(63)) <= set(pending_ids(layer))  # everything confirmed is persisted
        assert 999 not in pending_ids(layer)  # refused with 503: never taken
    finally:
        hooks.end()
        _wait(lambda: ing.done, 60, "ingest to end")
        ing.stop()
    assert ing.error is None


@pytest.mark.slow
def test_webhook_answers_503_under_backpressure(ft_config: FTConfig) -> None:
    layer = FTLayer(ft_config.replace(max_pending=5), "hook", "bp", num_channels=2).open()
    hooks = WebhookSource(reply_timeout_s=5.0, retry_after_s=2)
    ing = Ingestor(layer, hooks, key=_user).start()
    try:
        for i in range(5):
            assert post(hooks.url, {"i": i, "user": "u"})[0] == 200
        answers = [post(hooks.url, {"i": 5 + k, "user": "u"}) for k in range(3)]
        print(f"answers at max_pending: {answers}")
        assert (503, 2.0) in answers  # ingest waits for room: told the client to come back
        assert ing.paused is not None and ing.paused.startswith("backpressure")
    finally:
        hooks.end()
        ing.stop()


def test_a_null_record_is_refused_and_later_requests_are_confirmed_on_time(ft_config: FTConfig) -> None:
    """JSON null is not a record (ingest reads None as "nothing yet"): 400, and the requests after
    it are still answered 200 (a null taken in once shifted every later confirmation by one)."""
    layer = FTLayer(ft_config, "hook", "nulls", num_channels=2).open()
    hooks = WebhookSource(reply_timeout_s=5.0)
    ing = Ingestor(layer, hooks).start()
    try:
        assert post(hooks.url, None)[0] == 400
        assert post(hooks.url + "batch", [{"i": 0}, None])[0] == 400
        assert [post(hooks.url, {"i": i})[0] for i in range(1, 4)] == [200, 200, 200]
        assert layer.stats()["persisted"] == 3
    finally:
        hooks.end()
        ing.stop()
